"""Cluster and training specs: what the planner is given, validated on load.

A cluster file lists chip types (inline, or `from: chips/x.yaml` relative to the cluster file,
plus `count`) and may carry a `training` section (global batch, sequence length, ...), a `links`
section (bandwidth and latency per link class; h2.core.links), a `sites` list naming the sites
(datacenters) that stages may name besides their chip types' own `site`, and `nodes`, `regions`,
`region_links` sections (where each chip sits and the node- and region-level bandwidths;
h2.core.cluster_graph).
Sizes: memory in GB (10^9 bytes), bandwidths in GB/s, latency in microseconds, TFLOPS in 10^12/s.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass

from h2.core.cluster_graph import ClusterGraph, default_graph, graph_from_mapping
from h2.core.config_io import dataclass_from_mapping, load_yaml_mapping
from h2.core.emulation import ChipEmulation
from h2.core.errors import UserError
from h2.core.links import LinkSection, links_from_mapping

_SUFFIXES = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


MAX_COUNT = 1 << 50   # no batch, token or chip count of a plan comes near it


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
        denominator = 10 ** len(fraction or "")
        if numerator % denominator:
            raise UserError(f"{what}: {text!r} is not a whole number")
        value = numerator // denominator
    if not 0 < value <= MAX_COUNT:
        raise UserError(f"{what}: must be between 1 and {MAX_COUNT}, got {text!r}")
    return value


def check_range(value: float, low: float, high: float, where: str, name: str) -> None:
    """One line naming the field when a number is not finite or lies outside [low, high]."""
    if low == 0 and value < 0:
        raise UserError(f"{where}: field '{name}' must not be negative, got {value}")
    if low > 0 and value <= 0:
        raise UserError(f"{where}: field '{name}' must be positive, got {value}")
    if not (math.isfinite(value) and low <= value <= high):
        raise UserError(f"{where}: field '{name}' must be between {low:g} and {high:g}, got {value}")


@dataclass(frozen=True)
class ChipType:
    name: str
    count: int
    memory_gb: float
    chips_per_node: int
    tp_max: int
    intra_node_gbps: float
    inter_node_gbps: float
    latency_us: float = 10.0
    usable_memory_fraction: float = 0.9
    peak_tflops: float | None = None
    achievable_fraction: float = 0.45
    tp_efficiency_per_doubling: float = 1.0
    memory_bandwidth_gbps: float = 1600.0
    emulated: bool = False
    emulation: ChipEmulation | None = None   # what the DIPU host vendor emulates (h2.core.emulation)
    site: str | None = None                  # the datacenter its nodes sit in (h2.core.links); None: the default

    # bounds: every count, size and rate finite and inside what hardware spans, so no sum overflows
    RANGES = {"count": (1, 1 << 24), "chips_per_node": (1, 1 << 16), "tp_max": (1, 1 << 10),
              "memory_gb": (1e-6, 1e6), "intra_node_gbps": (1e-6, 1e9), "inter_node_gbps": (1e-6, 1e9),
              "memory_bandwidth_gbps": (1e-6, 1e9), "latency_us": (0.0, 1e9), "usable_memory_fraction": (1e-9, 1.0),
              "achievable_fraction": (1e-9, 1.0), "tp_efficiency_per_doubling": (1e-9, 1.0)}

    def validate(self, source: str) -> None:
        where = f"{source}: chip '{self.name}'"
        if self.emulation is not None:
            if not self.emulated:
                raise UserError(f"{where}: field 'emulated' is false but the chip has an 'emulation' section")
            self.emulation.validate(where)
        for name, (low, high) in self.RANGES.items():
            check_range(getattr(self, name), low, high, where, name)
        if self.peak_tflops is not None:
            check_range(self.peak_tflops, 1e-9, 1e9, where, "peak_tflops")
        if self.site is not None and not (isinstance(self.site, str) and self.site):
            raise UserError(f"{where}: field 'site' must name a site, got {self.site!r}")
        if self.tp_max & (self.tp_max - 1):
            raise UserError(f"{where}: field 'tp_max' must be a power of two, got {self.tp_max}")
        if self.tp_max > self.chips_per_node:
            raise UserError(f"{where}: field 'tp_max' ({self.tp_max}) exceeds chips_per_node ({self.chips_per_node}): "
                            "tensor parallelism stays inside a node")

    @property
    def capacity_bytes(self) -> float:
        return self.memory_gb * 1e9 * self.usable_memory_fraction

    def tp_compute_efficiency(self, tp: int) -> float:
        """Fraction of the achievable rate kept at TP size tp (smaller GEMMs, exposed collectives)."""
        return self.tp_efficiency_per_doubling ** (tp.bit_length() - 1)

    def tp_sizes(self) -> list[int]:
        sizes, tp = [], 1
        while tp <= self.tp_max:
            sizes.append(tp)
            tp *= 2
        return sizes


@dataclass(frozen=True)
class TrainingSpec:
    """Global batch (sequences = tokens / seq_len), micro-batch size, schedule bubble coefficient."""
    seq_len: int = 4096
    global_batch_tokens: int | None = None
    global_batch_sequences: int | None = None
    micro_batch_size: int = 1
    alpha: float = 1.0
    zero1: bool = True
    weight_bytes: int = 2         # bf16 weights
    gradient_bytes: int = 4       # fp32 gradient accumulation (Megatron's main_grad)
    optimizer_bytes: int = 12     # fp32 master weights + Adam m and v
    activation_bytes_per_element: int = 2

    def validate(self, source: str) -> None:
        check_range(self.seq_len, 1, 1 << 24, source, "seq_len")
        check_range(self.micro_batch_size, 1, 1 << 24, source, "micro_batch_size")
        if not 0 <= self.alpha <= 1:
            raise UserError(f"{source}: field 'alpha' must be in [0, 1] (1 for 1F1B, 0 for zero-bubble), got {self.alpha}")
        if (self.global_batch_tokens is None) == (self.global_batch_sequences is None):
            raise UserError(f"{source}: give exactly one of 'global_batch_tokens' or 'global_batch_sequences'")
        for name in ("global_batch_tokens", "global_batch_sequences"):
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
    named_sites: tuple[str, ...] = ()   # the file's `sites:` list (a chip type's site is named too)
    placed: ClusterGraph | None = None   # the file's `nodes` section, None where it has none

    @property
    def graph(self) -> ClusterGraph:
        """Every chip's node and region and the bandwidth between any two (h2.core.cluster_graph)."""
        if self.placed is not None:
            return self.placed
        return default_graph([(c.name, c.count, c.chips_per_node, c.intra_node_gbps, c.inter_node_gbps)
                              for c in self.chips])

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
        """The sites the file names: in `sites:`, as its chip types' and in its site pairs."""
        named = {chip.site for chip in self.chips if chip.site is not None} | set(self.named_sites)
        return frozenset(named.union(*(pair for pair, _ in self.links.site_pairs)))

    def by_descending_memory(self) -> list[ChipType]:
        """The pipeline order of chip types (Observation 4: larger memory earlier)."""
        return sorted(self.chips, key=lambda c: (-c.capacity_bytes, c.name))

    def only(self, name: str) -> "ClusterSpec":
        return dataclasses.replace(self, name=f"{self.name}/{name}", chips=(self.chip(name),))


_CHIP_FIELDS = {f.name for f in dataclasses.fields(ChipType)}


def _load_chip(entry: dict, base_dir: str, where: str) -> ChipType:
    merged = dict(entry)
    reference = merged.pop("from", None)
    if reference is not None:
        if not isinstance(reference, str):
            raise UserError(f"{where}: field 'from': expected a path string, got {reference!r}")
        path = reference if os.path.isabs(reference) else os.path.join(base_dir, reference)
        base = load_yaml_mapping(path)
        merged = {**base, **merged}
        where = f"{where} (from {path})"
    if merged.get("emulation") is not None:
        merged.setdefault("emulated", True)
    return dataclass_from_mapping(ChipType, merged, where)


def training_from_mapping(mapping: dict, source: str) -> TrainingSpec:
    data = dict(mapping)
    for name in ("global_batch_tokens", "global_batch_sequences"):
        if name in data and data[name] is not None:
            data[name] = parse_count(data[name], f"{source}: field '{name}'")
    training = dataclass_from_mapping(TrainingSpec, data, source)
    training.validate(source)
    return training


def load_cluster(path: str | os.PathLike) -> ClusterSpec:
    path = os.fspath(path)
    data = load_yaml_mapping(path)
    known = {"name", "chips", "training", "model", "description", "links", "sites", "nodes", "regions",
             "region_links"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{path}: unknown field '{unknown[0]}' (known: {', '.join(sorted(known))})")
    chips_data = data.get("chips")
    if not isinstance(chips_data, list) or not chips_data:
        raise UserError(f"{path}: field 'chips' must be a non-empty list of chip types")
    base_dir = os.path.dirname(path)
    chips = []
    for index, entry in enumerate(chips_data):
        where = f"{path}: chips[{index}]"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a mapping, got {type(entry).__name__}")
        chip = _load_chip(entry, base_dir, where)
        chip.validate(path)
        chips.append(chip)
    names = [c.name for c in chips]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"{path}: field 'chips': chip type '{duplicates[0]}' listed twice")
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
    links = links_from_mapping(data["links"], path) if data.get("links") is not None else LinkSection()
    sites = data.get("sites", [])
    if (not isinstance(sites, list) or not all(isinstance(site, str) and site for site in sites)
            or len(set(sites)) != len(sites)):
        raise UserError(f"{path}: field 'sites' must list distinct site names, got {sites!r}")
    placed = None
    if "nodes" in data:
        placed = graph_from_mapping(data, {c.name: (c.count, c.intra_node_gbps, c.inter_node_gbps) for c in chips}, path)
    elif "regions" in data or "region_links" in data:
        raise UserError(f"{path}: field '{'regions' if 'regions' in data else 'region_links'}' needs a 'nodes' section "
                        f"placing the chips in regions")
    return ClusterSpec(name=name, chips=tuple(chips), training=training, model=model, source=path, links=links,
                       named_sites=tuple(sites), placed=placed)
