"""The cluster file: its top-level spec and loader; the training spec it may carry.

A cluster file lists chip types (inline, or `from: chips/x.yaml` relative to the cluster file, plus
`count`; h2.core.chip_type) and may carry a `training` section (global batch, sequence length, ...)
and the sections that say where its chips sit and the link of each level (`nodes`, `sites`, `links`;
h2.core.placement). The queries over a whole loaded cluster (the nodes of a cluster, the link between
two ranks) are in h2.core.links, which imports this module.
Sizes: memory in GB (10^9 bytes), bandwidths in GB/s, latency in microseconds, TFLOPS in 10^12/s.

Imports only leaves: h2.core.errors, config_io, chip_type and placement.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from h2.core.chip_type import ChipType, check_range
from h2.core.config_io import check_path_name, dataclass_from_mapping, load_yaml_mapping
from h2.core.errors import UserError
from h2.core.placement import (
    LinkSection,
    Placement,
    links_from_mapping,
    placement_from_mapping,
    refuse_renamed,
    sites_from_list,
)

__all__ = [
    "ChipType", "ClusterSpec", "TrainingSpec", "check_range", "load_cluster", "parse_count", "training_from_mapping"
]

_SUFFIXES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}

MAX_COUNT = 1 << 50  # no batch, token or chip count of a plan comes near it


def parse_count(text: str | int, what: str) -> int:
    """An integer with an optional binary K/M/G suffix: '4M' = 4 * 2**20 (batch sizes are powers of two)."""
    if isinstance(text, bool):
        raise UserError(f"{what}: expected a count like 4M or 4194304, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d{1,20})(?:\.(\d{1,20}))?\s*([KMGkmg]?)\s*", str(text))
        if not match:
            raise UserError(f"{what}: expected a count like 4M or 4194304, got {text!r}")
        whole, fraction, suffix = match.groups()
        scale = _SUFFIXES[suffix.upper()]
        numerator = int(whole + (fraction or "")) * scale
        denominator = 10**len(fraction or "")
        if numerator % denominator:
            raise UserError(f"{what}: {text!r} is not a whole number")
        value = numerator // denominator
    if not 0 < value <= MAX_COUNT:
        raise UserError(f"{what}: must be between 1 and {MAX_COUNT}, got {text!r}")
    return value


@dataclass(frozen=True)
class TrainingSpec:
    """Global batch (sequences = tokens / seq_len), micro-batch size, schedule bubble coefficient."""
    seq_len: int = 4096
    global_batch_tokens: int | None = None
    global_batch_sequences: int | None = None
    micro_batch_size: int = 1
    alpha: float = 1.0
    zero1: bool = True
    # The global batch each chip type trains with alone when HeteroSpeedupRatio is computed (the H2 paper's
    # Table 6 runs: 2M tokens); None: the run's own global batch (the paper's constant-GBS comparison).
    baseline_gbs_tokens: int | None = None
    weight_bytes: int = 2  # bf16 weights
    gradient_bytes: int = 4  # fp32 gradient accumulation (Megatron's main_grad)
    optimizer_bytes: int = 12  # fp32 master weights + Adam m and v
    activation_bytes_per_element: int = 2

    def validate(self, source: str) -> None:
        check_range(self.seq_len, 1, 1 << 24, source, "seq_len")
        check_range(self.micro_batch_size, 1, 1 << 24, source, "micro_batch_size")
        if not 0 <= self.alpha <= 1:
            raise UserError(
                f"{source}: field 'alpha' must be in [0, 1] (1 for 1F1B, 0 for zero-bubble), got {self.alpha}")
        if (self.global_batch_tokens is None) == (self.global_batch_sequences is None):
            raise UserError(f"{source}: give exactly one of 'global_batch_tokens' or 'global_batch_sequences'")
        for name in ("global_batch_tokens", "global_batch_sequences", "baseline_gbs_tokens"):
            if getattr(self, name) is not None:
                check_range(getattr(self, name), 1, MAX_COUNT, source, name)
        if self.global_batch_tokens is not None and self.global_batch_tokens % self.seq_len:
            raise UserError(f"{source}: field 'global_batch_tokens' ({self.global_batch_tokens}) must be a positive "
                            f"multiple of seq_len ({self.seq_len})")
        if self.sequences % self.micro_batch_size:
            raise UserError(f"{source}: global batch of {self.sequences} sequences is not divisible by "
                            f"micro_batch_size {self.micro_batch_size}")
        for name in ("weight_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes_per_element"):
            check_range(getattr(self, name), 0, 64, source, name)

    @property
    def sequences(self) -> int:
        if self.global_batch_sequences is not None:
            return self.global_batch_sequences
        return self.global_batch_tokens // self.seq_len

    @property
    def tokens(self) -> int:
        return self.sequences * self.seq_len

    @property
    def micro_batch_units(self) -> int:
        """Global batch counted in micro-batches of size micro_batch_size: dp * b equals this."""
        return self.sequences // self.micro_batch_size

    def with_global_batch_tokens(self, tokens: int) -> "TrainingSpec":
        return dataclasses.replace(self, global_batch_tokens=tokens, global_batch_sequences=None)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    chips: tuple[ChipType, ...]
    training: TrainingSpec | None = None
    model: str | None = None
    source: str = "cluster"
    links: LinkSection = LinkSection()
    named_sites: tuple[str, ...] = ()  # the file's `sites:` list (a chip type's site is named too)
    placed: Placement | None = None  # the file's `nodes` section, None where it has none (h2.core.links:

    # placement_of gives every cluster's nodes)

    def chip(self, name: str) -> ChipType:
        for chip in self.chips:
            if chip.name == name:
                return chip
        raise UserError(f"{self.source}: unknown chip type '{name}' (known: {', '.join(c.name for c in self.chips)})")

    @property
    def total_chips(self) -> int:
        return sum(c.count for c in self.chips)

    @property
    def sites(self) -> frozenset:
        """The sites the file names: in `sites:`, as its chip types' and its nodes', and in its site pairs."""
        named = {chip.site for chip in self.chips if chip.site is not None} | set(self.named_sites)
        if self.placed is not None:
            named |= {node.site for node in self.placed.nodes}
        return frozenset(named.union(*(pair for pair, _ in self.links.site_pairs)))

    def by_descending_memory(self) -> list[ChipType]:
        """The pipeline order of chip types (Observation 4: larger memory earlier)."""
        return sorted(self.chips, key=lambda c: (-c.capacity_bytes, c.name))

    def only(self, name: str) -> "ClusterSpec":
        return dataclasses.replace(self, name=f"{self.name}/{name}", chips=(self.chip(name), ))


_CHIP_FIELDS = {f.name for f in dataclasses.fields(ChipType)}
_KNOWN = ("name", "chips", "training", "model", "description", "links", "sites", "nodes")
# the placement's old names (one vocabulary: site, bandwidth_gbps, latency_us; h2.core.placement)
_RENAMED = {"regions": "sites", "region_links": "links.site_pairs"}


def _load_chip(entry: dict, base_dir: str, where: str, source: str, prefix: str) -> ChipType:
    merged = dict(entry)
    reference = merged.pop("from", None)
    if reference is not None:
        if not isinstance(reference, str):
            raise UserError(f"{where}: field 'from': expected a path string, got {reference!r}")
        path = reference if os.path.isabs(reference) else os.path.join(base_dir, reference)
        base = load_yaml_mapping(path)
        refuse_renamed(base, path, "", {"region": "site"})
        merged = {**base, **merged}
        where = f"{where} (from {path})"
    refuse_renamed(merged, source, prefix, {"region": "site"})
    if merged.get("emulation") is not None:
        merged.setdefault("emulated", True)
    return dataclass_from_mapping(ChipType, merged, where)


def training_from_mapping(mapping: dict, source: str) -> TrainingSpec:
    data = dict(mapping)
    for name in ("global_batch_tokens", "global_batch_sequences", "baseline_gbs_tokens"):
        if name in data and data[name] is not None:
            data[name] = parse_count(data[name], f"{source}: field '{name}'")
    training = dataclass_from_mapping(TrainingSpec, data, source)
    training.validate(source)
    return training


def _load_chips(data: dict, path: str) -> tuple[ChipType, ...]:
    chips_data = data.get("chips")
    if not isinstance(chips_data, list) or not chips_data:
        raise UserError(f"{path}: field 'chips' must be a non-empty list of chip types")
    base_dir = os.path.dirname(path)
    chips = []
    for index, entry in enumerate(chips_data):
        where = f"{path}: chips[{index}]"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a mapping, got {type(entry).__name__}")
        chip = _load_chip(entry, base_dir, where, path, f"chips[{index}].")
        check_path_name(chip.name, f"{where}: field 'name'")
        chip.validate(path)
        chips.append(chip)
    names = [c.name for c in chips]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"{path}: field 'chips': chip type '{duplicates[0]}' listed twice")
    return tuple(chips)


def _load_placement(data: dict, chips: tuple[ChipType, ...], links: LinkSection,
                    path: str) -> tuple[tuple[str, ...], Placement | None]:
    """The names of the file's sites and, where it has `nodes`, its placement (h2.core.placement)."""
    sites = sites_from_list(data.get("sites", []), path)
    if "nodes" not in data:
        for index, (site, link) in enumerate(sites):
            for field in ("bandwidth_gbps", "latency_us"):
                if getattr(link, field) is not None:
                    raise UserError(f"{path}: sites[{index}]: field '{field}' needs a 'nodes' section placing the "
                                    f"chips on the site's nodes (without one, the `links:` classes set each level)")
        return tuple(name for name, _ in sites), None
    for index, chip in enumerate(chips):
        if chip.site is not None:
            raise UserError(f"{path}: chips[{index}]: field 'site': the 'nodes' section places the chips; "
                            f"give each node its site instead")
    placed = placement_from_mapping(data, {c.name: (c.count, c.intra_node_gbps, c.inter_node_gbps)
                                           for c in chips}, sites, links, path)
    return tuple(name for name, _ in sites), placed


def load_cluster(path: str | os.PathLike) -> ClusterSpec:
    path = os.fspath(path)
    data = load_yaml_mapping(path)
    refuse_renamed(data, path, "", _RENAMED)
    unknown = sorted(set(data) - set(_KNOWN))
    if unknown:
        raise UserError(f"{path}: unknown field '{unknown[0]}' (known: {', '.join(sorted(_KNOWN))})")
    chips = _load_chips(data, path)
    training = None
    if data.get("training") is not None:
        if not isinstance(data["training"], dict):
            raise UserError(f"{path}: field 'training': expected a mapping")
        training = training_from_mapping(data["training"], f"{path}: training")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise UserError(f"{path}: field 'model': expected a preset name or a path, got {model!r}")
    name = data.get("name", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(name, str):
        raise UserError(f"{path}: field 'name': expected a string, got {name!r}")
    if "name" in data:  # the default, the file's own name, has no '/'
        check_path_name(name, f"{path}: field 'name'")
    links = links_from_mapping(data["links"], path) if data.get("links") is not None else LinkSection()
    sites, placed = _load_placement(data, chips, links, path)
    return ClusterSpec(name=name, chips=chips, training=training, model=model, source=path, links=links,
                       named_sites=sites, placed=placed)
