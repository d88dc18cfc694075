"""Per-chip-type profiles: per-layer forward/backward/recompute time and activation memory for each
TP size, and per-layer update time for each (dp, tp). Loaded from YAML, or synthesised from a spec sheet.

Times are for one decoder layer and one micro-batch (micro_batch_size sequences of seq_len tokens)
on one chip of a TP group. Parameter memory is not profiled: the model's exact accounting gives it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import yaml

from h2.core import emulation
from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.config_io import dataclass_from_mapping, load_yaml_mapping
from h2.core.emulation import measurement_trust
from h2.core.errors import UserError
from h2.core.links import Link, Location, link_between
from h2.core.model_config import ModelConfig
from h2.core.numbers import divisors


@dataclass(frozen=True)
class LayerProfile:
    tp: int
    forward_s: float
    backward_s: float
    recompute_s: float
    activation_bytes: int  # kept per layer per micro-batch in flight, no recompute
    recompute_activation_bytes: int  # kept per layer per micro-batch in flight, with full recompute
    workspace_bytes: int = 0  # memory one layer's backward needs beyond what it kept (measured)

    def compute_s(self, recompute: bool) -> float:
        """t_fwd + t_bwd + r * t_recomp: one layer, one micro-batch."""
        return self.forward_s + self.backward_s + (self.recompute_s if recompute else 0.0)


@dataclass(frozen=True)
class UpdateProfile:
    dp: int
    tp: int
    seconds_per_layer: float  # optimizer step + gradient synchronisation not overlapped by backward


@dataclass(frozen=True)
class StageEndProfile:
    """What the first stage (embedding) and the last stage (final norm, head, loss) compute besides
    their layers, per micro-batch on one chip of a TP group."""
    tp: int
    embedding_forward_s: float
    embedding_backward_s: float
    head_forward_s: float
    head_backward_s: float


@dataclass(frozen=True)
class Profile:
    chip: str
    model: str
    seq_len: int
    micro_batch_size: int
    layers: list[LayerProfile]
    update: list[UpdateProfile]
    source: str = "synthesised"  # or "measured"
    device: str | None = None
    assumptions: list[str] = field(default_factory=list)
    stage_ends: list[StageEndProfile] = field(default_factory=list)
    # Measured profiles only: the layers as the spec-sheet formula derives them from the tp = 1
    # measurement (compute / tp + the TP all-reduces over the chip's intra-node link), for comparison.
    formula_layers: list[LayerProfile] = field(default_factory=list)
    fingerprint: str | None = None  # what it was measured for (profile_fingerprint); None: not cached
    # False: measured while the host made more than h2.core.emulation.UNTRUSTED_FRACTION of its emulated
    # kernel time late (written only by `heteroauto profile --force`; never reused from the cache).
    trusted: bool = True
    late_fraction: float = 0.0  # an untrusted profile's: the largest late fraction of its measurements

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_tp", {entry.tp: entry for entry in self.layers})
        object.__setattr__(self, "_update", {(u.dp, u.tp): u.seconds_per_layer for u in self.update})
        object.__setattr__(self, "_ends", {entry.tp: entry for entry in self.stage_ends})

    def layer(self, tp: int) -> LayerProfile | None:
        return self._by_tp.get(tp)

    def stage_end(self, tp: int) -> StageEndProfile | None:
        return self._ends.get(tp)

    def update_s(self, dp: int, tp: int) -> float | None:
        return self._update.get((dp, tp))

    def tp_sizes(self) -> list[int]:
        return sorted(self._by_tp)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        keys = [
            "chip", "source", "device", "model", "seq_len", "micro_batch_size", "assumptions", "layers", "update",
            "stage_ends"
        ]
        keys += [key for key in ("formula_layers", "fingerprint") if data[key]]
        keys += [] if self.trusted else ["trusted", "late_fraction"]
        return {key: data[key] for key in keys}


def ring_allreduce_s(nbytes: float, ranks: int, gbps: float, latency_us: float) -> float:
    """Ring all-reduce: 2(n-1)/n of the bytes over the link, 2(n-1) latency steps."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (gbps * 1e9) + 2 * (ranks - 1) * latency_us * 1e-6


def dp_sizes(chip: ChipType, tp: int) -> list[int]:
    return divisors(chip.count // tp) if chip.count % tp == 0 else []


def update_s_per_layer(model: ModelConfig, training: TrainingSpec, chip: ChipType, dp: int, tp: int,
                       optimizer_s_at_dp1: float | None = None) -> float:
    """Adam step on this rank's share of one layer, plus the gradient reduce-scatter / weight all-gather
    (ZeRO-1; a plain all-reduce without it) across dp, assumed not overlapped with backward."""
    shard_params = model.layer_params() / tp
    if optimizer_s_at_dp1 is None:
        bytes_touched_per_param = training.gradient_bytes + 2 * training.optimizer_bytes + training.weight_bytes
        optimizer_s_at_dp1 = shard_params * bytes_touched_per_param / (chip.memory_bandwidth_gbps * 1e9)
    optimizer_s = optimizer_s_at_dp1 / dp if training.zero1 else optimizer_s_at_dp1
    sync_s = ring_allreduce_s(shard_params * training.weight_bytes, dp, chip.inter_node_gbps, chip.latency_us)
    return optimizer_s + sync_s


def tp_collective_s(model: ModelConfig, training: TrainingSpec, chip: ChipType, tp: int) -> float:
    """One of the two all-reduces per layer pass (attention output, MLP output) of Megatron-style TP."""
    nbytes = training.micro_batch_size * training.seq_len * model.hidden_size * training.activation_bytes_per_element
    return ring_allreduce_s(nbytes, tp, chip.intra_node_gbps, chip.latency_us)


def activation_entry_bytes(model: ModelConfig, training: TrainingSpec, tp: int) -> tuple[int, int]:
    full = model.layer_activation_bytes(training.micro_batch_size, training.seq_len,
                                        bytes_per_element=training.activation_bytes_per_element, tp=tp)
    kept = model.layer_recompute_activation_bytes(training.micro_batch_size, training.seq_len,
                                                  bytes_per_element=training.activation_bytes_per_element)
    return full, kept


def synthesise_profile(chip: ChipType, model: ModelConfig, training: TrainingSpec) -> Profile:
    """Derive a profile from the spec sheet: FLOPs / achievable FLOP rate, TP collectives from bandwidth."""
    if chip.peak_tflops is None:
        raise UserError(f"chip '{chip.name}': field 'peak_tflops' is needed to synthesise a profile "
                        "(or pass a measured one with --profile)")
    rate = chip.peak_tflops * 1e12 * chip.achievable_fraction
    tokens = training.micro_batch_size * training.seq_len
    forward_flops = model.layer_forward_flops_per_token(training.seq_len) * tokens
    backward_flops = model.layer_backward_flops_per_token(training.seq_len) * tokens
    recompute_flops = model.layer_recompute_flops_per_token(training.seq_len) * tokens
    layers, update = [], []
    for tp in chip.tp_sizes():
        collective = tp_collective_s(model, training, chip, tp)
        tp_rate = rate * tp * chip.tp_compute_efficiency(tp)
        full, kept = activation_entry_bytes(model, training, tp)
        layers.append(
            LayerProfile(tp=tp, forward_s=forward_flops / tp_rate + 2 * collective,
                         backward_s=backward_flops / tp_rate + 2 * collective, recompute_s=recompute_flops / tp_rate +
                         2 * collective, activation_bytes=full, recompute_activation_bytes=kept))
        for dp in dp_sizes(chip, tp):
            update.append(
                UpdateProfile(dp=dp, tp=tp, seconds_per_layer=update_s_per_layer(model, training, chip, dp, tp)))
    assumptions = [
        f"compute at {chip.achievable_fraction:g} x {chip.peak_tflops:g} peak TFLOPS = "
        f"{rate / 1e12:.1f} TFLOPS achieved, "
        f"split over the TP group at {chip.tp_efficiency_per_doubling:g} efficiency per doubling of tp "
        "(smaller GEMMs, kernel overheads)",
        "FLOPs from h2.model.config: backward = 2 x forward, recompute = 1 x forward, full s x s attention square",
        f"TP: 2 ring all-reduces of s*b*h activations per pass over {chip.intra_node_gbps:g} GB/s intra-node, "
        f"{chip.latency_us:g} us latency per step",
        f"update: Adam touching {training.gradient_bytes + 2 * training.optimizer_bytes + training.weight_bytes} bytes "
        f"per parameter at {chip.memory_bandwidth_gbps:g} GB/s" +
        (", sharded over dp (ZeRO-1)" if training.zero1 else "") +
        f"; gradient sync = ring all-reduce volume over {chip.inter_node_gbps:g} GB/s inter-node, not overlapped",
        f"activations: h2.model.config accounting at {training.activation_bytes_per_element} bytes per element, "
        "fused attention (no s x s probabilities kept); recompute keeps only the layer input",
        "stage ends (embedding, head) not synthesised: the paper's model counts decoder layers only",
    ]
    return Profile(chip=chip.name, model=model.name, seq_len=training.seq_len,
                   micro_batch_size=training.micro_batch_size, layers=layers, update=update, source="synthesised",
                   assumptions=assumptions)


def load_profile(path: str | os.PathLike) -> Profile:
    path = os.fspath(path)
    data = load_yaml_mapping(path)
    profile = dataclass_from_mapping(Profile, data, path)
    if not profile.layers:
        raise UserError(f"{path}: field 'layers' must list at least one TP size")
    for index, entry in enumerate(profile.layers):
        for name, high in (("forward_s", 1e6), ("backward_s", 1e6), ("recompute_s", 1e6), ("activation_bytes", 1e18),
                           ("recompute_activation_bytes", 1e18), ("workspace_bytes", 1e18)):
            if not 0 <= getattr(entry, name) <= high:
                raise UserError(f"{path}: field 'layers[{index}].{name}' must be between 0 and {high:g}, "
                                f"got {getattr(entry, name)}")
        if not 0 < entry.tp <= 1 << 10 or entry.tp & (entry.tp - 1):
            raise UserError(f"{path}: field 'layers[{index}].tp' must be a power of two up to 1024, got {entry.tp}")
    tps = [entry.tp for entry in profile.layers]
    if len(set(tps)) != len(tps):
        raise UserError(f"{path}: field 'layers': a TP size is listed twice")
    for index, entry in enumerate(profile.update):
        if not (0 <= entry.seconds_per_layer <= 1e6 and 0 < entry.dp <= 1 << 24 and 0 < entry.tp <= 1 << 10):
            raise UserError(f"{path}: field 'update[{index}]': dp and tp must be positive counts and "
                            f"seconds_per_layer between 0 and 1e6")
    for index, end in enumerate(profile.stage_ends):
        for name in ("embedding_forward_s", "embedding_backward_s", "head_forward_s", "head_backward_s"):
            if not 0 <= getattr(end, name) <= 1e6:
                raise UserError(f"{path}: field 'stage_ends[{index}].{name}' must be between 0 and 1e6, "
                                f"got {getattr(end, name)}")
    return profile


def save_profile(profile: Profile, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(profile.to_dict(), handle, sort_keys=False)


def check_profile_matches(profile: Profile, source: str, cluster: ClusterSpec, model: ModelConfig,
                          training: TrainingSpec) -> None:
    """A loaded profile must name a chip of the cluster and the model/sequence length being planned."""
    known = [c.name for c in cluster.chips]
    if profile.chip not in known:
        raise UserError(f"{source}: field 'chip': unknown chip type '{profile.chip}' (cluster {cluster.source} has: "
                        f"{', '.join(known)})")
    if profile.seq_len != training.seq_len:
        raise UserError(f"{source}: field 'seq_len': profiled at {profile.seq_len}, planning for {training.seq_len}")
    if profile.micro_batch_size != training.micro_batch_size:
        raise UserError(f"{source}: field 'micro_batch_size': profiled at {profile.micro_batch_size}, "
                        f"planning for {training.micro_batch_size}")
    if profile.model != model.name:
        raise UserError(f"{source}: field 'model': profiled for '{profile.model}', planning for '{model.name}'")
    if profile.fingerprint is not None and profile.fingerprint != profile_fingerprint(
            cluster, cluster.chip(profile.chip), model, training):
        raise UserError(f"{source}: field 'fingerprint': measured for another entry of chip '{profile.chip}', model, "
                        f"micro-batch shape or emulator pacing than cluster {cluster.source} gives now; run heteroauto "
                        f"profile again")


def profiles_for(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec,
                 profile_paths: list[str] = ()) -> dict[str, Profile]:
    """Loaded profiles where given, synthesised ones for the other chip types."""
    loaded: dict[str, Profile] = {}
    for path in profile_paths:
        profile = load_profile(path)
        check_profile_matches(profile, path, cluster, model, training)
        if profile.chip in loaded:
            raise UserError(f"{path}: field 'chip': a second profile for chip type '{profile.chip}'")
        loaded[profile.chip] = profile
    return {chip.name: loaded.get(chip.name) or synthesise_profile(chip, model, training) for chip in cluster.chips}


def intra_node_link(cluster: ClusterSpec, chip: ChipType) -> Link:
    """The link a TP group of `chip` uses (one node): the cluster's intra_node class over the chip's own."""
    node = Location(chip.name, 0)
    return link_between(cluster, node, node)[1]


def _measured_device(chip: ChipType, device: str) -> str:
    """Where a chip type's profile was measured: its emulated or vendor's dipu device, else `device`."""
    if chip.emulation is not None:
        return "dipu (emulated)"
    return f"dipu ({chip.vendor} vendor)" if chip.vendor is not None else device


def profile_fingerprint(cluster: ClusterSpec, chip: ChipType, model: ModelConfig, training: TrainingSpec) -> str:
    """What a measured profile depends on: the chip type's whole entry (emulation included) and its
    intra-node link, the model, the micro-batch shape and precision, and for an emulated chip the rules
    that paced its kernels (h2.core.emulation.PACING_REVISION). A cached profile with another fingerprint
    is stale."""
    import hashlib
    import json

    basis = {
        "chip": dataclasses.asdict(chip), "link": dataclasses.asdict(intra_node_link(cluster, chip)),
        "model": model.to_dict(), "seq_len": training.seq_len, "micro_batch_size": training.micro_batch_size,
        "bytes": training.activation_bytes_per_element
    }
    if chip.emulation is not None:
        basis["pacing"] = emulation.PACING_REVISION
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def formula_layer(measured_tp1: LayerProfile, model: ModelConfig, training: TrainingSpec, chip: ChipType, tp: int,
                  link: Link) -> LayerProfile:
    """A layer at `tp` derived from its tp = 1 measurement as the spec-sheet synthesis does: compute
    split over tp at the chip's efficiency per doubling, plus two ring all-reduces per pass over the
    intra-node `link`; activation memory scaled by the model's tp-sharded accounting."""
    nbytes = training.micro_batch_size * training.seq_len * model.hidden_size * training.activation_bytes_per_element
    collective = ring_allreduce_s(nbytes, tp, link.bandwidth_gbps, link.latency_us)
    slowdown = tp * chip.tp_compute_efficiency(tp)
    full_tp, _ = activation_entry_bytes(model, training, tp)
    full_tp1, _ = activation_entry_bytes(model, training, 1)
    return LayerProfile(tp=tp, forward_s=measured_tp1.forward_s / slowdown + 2 * collective,
                        backward_s=measured_tp1.backward_s / slowdown + 2 * collective,
                        recompute_s=measured_tp1.recompute_s / slowdown + 2 * collective, activation_bytes=int(
                            measured_tp1.activation_bytes * full_tp / full_tp1),
                        recompute_activation_bytes=measured_tp1.recompute_activation_bytes, workspace_bytes=int(
                            measured_tp1.workspace_bytes / tp))


def measured_profile(cluster: ClusterSpec, chip: ChipType, model: ModelConfig, training: TrainingSpec,
                     measurements: list[dict], *, device: str, repeats: int) -> Profile:
    """A profile from the runtime's measurements (heteropp.profiling.TPMeasurement as dicts), one per
    TP size of the chip. Data-parallel sizes above 1 are derived: the measured update divided over dp
    under ZeRO-1, plus the gradient all-reduce over the inter-node link (not measured here)."""
    by_tp = {m["tp"]: m for m in measurements}
    layers, update, ends = [], [], []
    for tp in sorted(by_tp):
        m = by_tp[tp]
        layers.append(
            LayerProfile(tp=tp, forward_s=m["forward_s"], backward_s=m["backward_s"], recompute_s=m["recompute_s"],
                         activation_bytes=m["activation_bytes"],
                         recompute_activation_bytes=m["recompute_activation_bytes"],
                         workspace_bytes=m["workspace_bytes"] or 0))
        ends.append(
            StageEndProfile(tp=tp, embedding_forward_s=m["embedding_forward_s"],
                            embedding_backward_s=m["embedding_backward_s"], head_forward_s=m["head_forward_s"],
                            head_backward_s=m["head_backward_s"]))
        for dp in dp_sizes(chip, tp):
            update.append(
                UpdateProfile(
                    dp=dp, tp=tp, seconds_per_layer=update_s_per_layer(model, training, chip, dp, tp,
                                                                       optimizer_s_at_dp1=m["update_s"])))
    link = intra_node_link(cluster, chip)
    formula = [formula_layer(layers[0], model, training, chip, tp, link) for tp in sorted(by_tp)] if 1 in by_tp else []
    late = max(m["late_fraction"] for m in measurements)
    where = (f"emulated chip (relative speed {chip.emulation.relative_speed:g} of a host core, "
             f"{chip.memory_gb:g} GB) on the dipu device" if chip.emulation else f"torch device '{device}'")
    assumptions = [
        f"measured on the {where}, one micro-batch of {training.micro_batch_size} x {training.seq_len} tokens: "
        f"every TP size by running its TP ranks (heteropp.profiling), median of {repeats} rounds, the slowest rank",
        "forward and forward+backward of one HeteroPP layer (backward = the per-round difference); recompute = "
        "the extra time of the same layer under activation recompute",
        "memory: device bytes a layer holds from forward to backward, with and without recompute, and the "
        "workspace of its backward",
        "stage ends: embedding forward/backward (first stage) and norm + head + loss (last stage) "
        "measured the same way",
        f"update: measured squared-norm + clip + AdamW step of one layer's shard; dp > 1 derived: / dp (ZeRO-1) + "
        f"ring all-reduce of the gradient over {chip.inter_node_gbps:g} GB/s inter-node, not overlapped",
        f"late kernels: {late:.2%} of the emulated kernel time at worst (the host's load)",
    ]
    return Profile(
        chip=chip.name, model=model.name, seq_len=training.seq_len, micro_batch_size=training.micro_batch_size,
        layers=layers, update=update, source="measured", device=_measured_device(chip, device),
        assumptions=assumptions, stage_ends=ends, formula_layers=formula, fingerprint=profile_fingerprint(
            cluster, chip, model, training), trusted=measurement_trust(late, 1.0).trusted, late_fraction=late)
