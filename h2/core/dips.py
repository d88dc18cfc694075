"""What a Di-PS run is, as plain data: the run file (`configs/dips/*.yaml`, `DipsConfig`) read by the
master, the shards and the local launcher, and the options a cluster's trainer takes to join one
(`PSOptions`: `h2 train --ps ADDRESS ...`).

A run file is one YAML mapping checked against these dataclasses: an unknown, missing or mistyped
field, or a value out of range, is one line naming the file and the field.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Literal

from h2.core.config_io import dataclass_from_mapping, load_yaml_mapping
from h2.core.errors import UserError
from h2.core.model_config import resolve_model
from h2.core.training import MAX_GLOBAL_BATCH, MAX_STEPS, MAX_TIMEOUT_S, TrainConfig, option

MODES = ("sync", "async", "dips", "async-diloco")
SECRET_ENV = "H2_PS_SECRET_FILE"  # names a process's Di-PS credential file when no flag does (h2.ps.auth)
MAX_SHARDS = 256  # shard processes one launcher starts; the model's layers are split over them


@dataclass(frozen=True)
class ModeRules:
    """What a mode changes, decided here for the master, the shards, the clusters and the simulator."""
    round_closes: Literal["all", "window", "at_once"]  # every active cluster committed | grace_s after the last
    # arrival | the first arrival makes a round of its own
    penalty: bool  # the pseudo-gradient penalty judges the pushes (reject, clip)
    # async DiLoCo on a decentralized architecture: each cluster holds its own copy of the global model and its
    # own outer optimizer; the shards only reduce the pushed pseudo-gradients (the all-reduce) and hold no model
    decentralized: bool


MODE_RULES = {
    "sync": ModeRules("all", penalty=False, decentralized=False),
    "async": ModeRules("at_once", penalty=False, decentralized=False),
    "dips": ModeRules("window", penalty=True, decentralized=False),
    "async-diloco": ModeRules("window", penalty=False, decentralized=True),
}


@dataclass
class OuterOptions:
    """The outer optimizer the shards run on the global model (DiLoCo's: Nesterov, lr 0.7, momentum 0.8)."""
    optimizer: Literal["nesterov", "sgd"] = "nesterov"
    lr: float = 0.7
    momentum: float = 0.8


@dataclass
class PenaltyOptions:
    """The pseudo-gradient penalty of mode `dips` (Di-PS section 4.1)."""
    alpha: float = 0.02  # EMA factor of the norm's mean and deviation
    beta: float = 3.0  # reject a cluster whose score exceeds beta * max(accepted scores)
    clip_norm: float = 1.0  # clip the averaged pseudo-gradient to this global L2 norm (0: no clip)
    warmup_scores: int = 4  # accept every finite norm until this many scores are on record


@dataclass
class ClusterSpec:
    """One cluster of a local emulated run: its id and how the launcher starts its trainer."""
    id: str
    strategy: str | None = None  # a HeteroPP strategy file: the cluster is that pipeline (torchrun), else one device
    step_time_s: float = 0.0  # emulated speed: every inner step padded to this many seconds (0: unpaced)
    outlier: Literal["none", "scale", "nan"] = "none"  # fault injection into what it pushes
    outlier_every: int = 1  # ... on every N-th push
    outlier_scale: float = 100.0  # ... the pushed pseudo-gradient multiplied by this
    throughput: float = 0.0  # p_j of the shards' placement (any unit shared by all clusters; 0: 1 / step_time_s)


@dataclass
class SiteSpec:
    """A candidate site for the shards (h2.ps.placement): where they listen and its links to the clusters."""
    name: str
    host: str  # the address the shards listen on when placed here
    bandwidth_gbps: list[float] = field(default_factory=list)  # B[i][j]: to each cluster, in the run file's order


@dataclass
class DipsConfig:
    mode: Literal["sync", "async", "dips", "async-diloco"] = "dips"
    model: str = "tiny"  # model preset, or a model YAML or Hugging Face config.json (h2.core.model_config)
    seed: int = 0  # the initial global model
    inner_steps: int = 8  # H: inner steps between two pushes of a cluster
    tokens: int = 0  # stop once the outer loop consumed this many tokens (0: no limit)
    grace_s: float = 1.0  # modes dips and async-diloco: the window every arrival re-arms
    heartbeat_s: float = 1.0  # clusters and shards beat this often
    missed_beats: int = 3  # ... and are dropped after this many missed beats
    transfer_timeout_s: float = 30.0  # a layer's push or pull that takes longer fails (the sync point is skipped)
    sync_retry_s: float = 30.0  # a skipped sync point is retried every heartbeat this long before training on
    ticket_ttl_s: float = 0.0  # a push ticket not committed this long expires (0: 4 x transfer_timeout_s, >= 60 s)
    host: str = "127.0.0.1"  # where the master and the shards listen
    master_port: int = 0  # the master's gRPC port (0: the launcher picks a free one)
    shards: int = 2  # shard servers; the model's layers are split over them
    eval_sequences: int = 8  # held-out sequences a cluster scores each global model it pulls on
    # data handed out in chunks by the master (h2.ps.chunks): chunks per epoch = this x clusters; 0: each
    # cluster reads its fixed part (partition i of n) of every batch
    chunks_per_cluster: int = 0
    out: str = "runs/dips"  # master state, rounds.jsonl, shard snapshots, clusters' folders
    outer: OuterOptions = field(default_factory=OuterOptions)
    penalty: PenaltyOptions = field(default_factory=PenaltyOptions)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=1_000_000, checkpoint_every=0))
    clusters: list[ClusterSpec] = field(default_factory=list)
    sites: list[SiteSpec] = field(default_factory=list)  # candidate shard sites (empty: the shards listen on host)

    @property
    def rules(self) -> ModeRules:
        return MODE_RULES[self.mode]

    @property
    def uses_penalty(self) -> bool:
        return self.rules.penalty

    @property
    def window_s(self) -> float:
        """How long the master waits for more clusters after an arrival (sync waits for all instead; in
        async-diloco the window is the all-reduce's matchmaking: who else finished its inner phase)."""
        return self.grace_s if self.rules.round_closes == "window" else 0.0


def _checks(config: DipsConfig) -> list[tuple[str, bool, str]]:
    p, o = config.penalty, config.outer
    return [
        ("inner_steps", config.inner_steps >= 1, "must be at least 1"),
        ("tokens", config.tokens >= 0, "must be 0 (no limit) or positive"),
        ("grace_s", config.grace_s >= 0, "must be 0 or positive"),
        ("heartbeat_s", config.heartbeat_s > 0, "must be positive"),
        ("missed_beats", config.missed_beats >= 1, "must be at least 1"),
        ("transfer_timeout_s", config.transfer_timeout_s > 0, "must be positive"),
        ("sync_retry_s", math.isfinite(config.sync_retry_s)
         and config.sync_retry_s >= 0, "must be 0 (train on at once) or a positive number of seconds"),
        ("ticket_ttl_s", math.isfinite(config.ticket_ttl_s)
         and config.ticket_ttl_s >= 0, "must be 0 (4 x transfer_timeout_s) or a positive number of seconds"),
        ("master_port", 0 <= config.master_port <= 65535, "must be a TCP port (0: pick a free one)"),
        ("shards", config.shards >= 1, "must be at least 1"),
        ("eval_sequences", config.eval_sequences >= 0, "must be 0 or positive"),
        ("chunks_per_cluster", config.chunks_per_cluster >= 0, "must be 0 (fixed partitions) or positive"),
        ("outer.lr", o.lr > 0, "must be positive"),
        ("outer.momentum", 0 <= o.momentum < 1, "must be in [0, 1)"),
        ("penalty.alpha", 0 < p.alpha <= 1, "must be in (0, 1]"),
        ("penalty.beta", p.beta > 0, "must be positive"),
        ("penalty.clip_norm", p.clip_norm >= 0, "must be 0 (no clip) or positive"),
        ("penalty.warmup_scores", p.warmup_scores >= 0, "must be 0 or positive"),
    ] + _upper_bounds(config)


def _upper_bounds(config: DipsConfig) -> list[tuple[str, bool, str]]:
    """Counts and times past which unbounded work would follow (no real run comes near them)."""
    times = [(name, getattr(config, name) <= MAX_TIMEOUT_S, f"must be at most {MAX_TIMEOUT_S:g} s")
             for name in ("grace_s", "heartbeat_s", "transfer_timeout_s", "sync_retry_s")]
    return times + [
        ("inner_steps", config.inner_steps <= MAX_STEPS, f"must be at most {MAX_STEPS}"),
        ("missed_beats", config.missed_beats <= 1000, "must be at most 1000"),
        ("shards", config.shards <= MAX_SHARDS, f"must be at most {MAX_SHARDS}"),
        ("eval_sequences", config.eval_sequences <= MAX_GLOBAL_BATCH, f"must be at most {MAX_GLOBAL_BATCH}"),
        ("seed", 0 <= config.seed < 2**32, "must be in [0, 2**32)"),
    ]


def check_dips_config(config: DipsConfig, source: str) -> DipsConfig:
    """Raise a one-line UserError naming `source` and the first field out of range."""
    try:
        resolve_model(config.model)
    except UserError as error:
        raise UserError(f"{source}: field 'model': {error}") from None
    for name, ok, requirement in _checks(config):
        if not ok:
            value = config
            for part in name.split("."):
                value = getattr(value, part)
            raise UserError(f"{source}: field '{name}' {requirement}, got {value!r}")
    if not config.clusters:
        raise UserError(f"{source}: field 'clusters' lists no cluster (the master accepts only listed clusters)")
    seen = set()
    for index, cluster in enumerate(config.clusters):
        where = f"{source}: field 'clusters[{index}]"
        if not cluster.id or not cluster.id.replace("-", "").replace("_", "").isalnum():
            raise UserError(f"{where}.id' must be letters, digits, '-' or '_', got {cluster.id!r}")
        if cluster.id in seen:
            raise UserError(f"{where}.id': duplicate cluster id '{cluster.id}'")
        seen.add(cluster.id)
        if cluster.step_time_s < 0:
            raise UserError(f"{where}.step_time_s' must be 0 or positive, got {cluster.step_time_s}")
        if cluster.step_time_s > MAX_TIMEOUT_S:
            raise UserError(f"{where}.step_time_s' must be at most {MAX_TIMEOUT_S:g} s, got {cluster.step_time_s}")
        if cluster.strategy is not None and cluster.outlier != "none":
            raise UserError(f"{where}.outlier': fault injection is for single-device clusters, not a strategy's")
        if cluster.strategy is not None and config.chunks_per_cluster:
            raise UserError(f"{where}.strategy': chunks (chunks_per_cluster) are read by single-device clusters only; "
                            f"a strategy's cluster reads its fixed partition (set chunks_per_cluster: 0)")
        if config.rules.decentralized and cluster.strategy is not None:
            raise UserError(f"{where}.strategy': mode async-diloco runs single-device clusters only (a pipeline's "
                            f"stages do not keep the cluster's copy of the global model)")
        if config.rules.decentralized and cluster.outlier != "none":
            raise UserError(f"{where}.outlier': mode async-diloco has no fault injection (its clusters push "
                            f"pseudo-gradients, which the injection does not scale)")
        if cluster.outlier_every < 1:
            raise UserError(f"{where}.outlier_every' must be at least 1, got {cluster.outlier_every}")
        if cluster.outlier_every > MAX_STEPS:
            raise UserError(f"{where}.outlier_every' must be at most {MAX_STEPS}, got {cluster.outlier_every}")
        if not math.isfinite(cluster.outlier_scale):
            raise UserError(f"{where}.outlier_scale' must be a finite number, got {cluster.outlier_scale}")
    _check_sites(config, source)
    return config


def _check_sites(config: DipsConfig, source: str) -> None:
    for index, site in enumerate(config.sites):
        where = f"{source}: field 'sites[{index}].bandwidth_gbps'"
        if len(site.bandwidth_gbps) != len(config.clusters):
            raise UserError(f"{where} must give one bandwidth per cluster ({len(config.clusters)}), "
                            f"got {len(site.bandwidth_gbps)}")
        if any(not math.isfinite(b) or b < 0 for b in site.bandwidth_gbps):
            raise UserError(f"{where} must be finite and 0 or positive, got {site.bandwidth_gbps}")
    for index, cluster in enumerate(config.clusters):
        if not math.isfinite(cluster.throughput) or cluster.throughput < 0:
            raise UserError(f"{source}: field 'clusters[{index}].throughput' must be 0 or positive, "
                            f"got {cluster.throughput}")


def load_dips_config(path: str | os.PathLike) -> DipsConfig:
    """Read and check a Di-PS run file."""
    path = os.fspath(path)
    data = load_yaml_mapping(path)
    try:
        config = dataclass_from_mapping(DipsConfig, data, path)
    except UserError as error:
        message = str(error)
        raise UserError(message if message.startswith(path) else f"{path}: field 'train': {message}") from None
    return check_dips_config(config, path)


@dataclass
class PSOptions:
    """How a cluster's trainer joins a Di-PS run (`h2 train --ps ADDRESS`)."""
    ps: str | None = option(
        None, "join a Di-PS run: the master's HOST:PORT; push and pull the model every "
        "inner_steps steps (set by the master)", metavar="HOST:PORT")
    cluster_id: str | None = option(None, "this cluster's id in the Di-PS run (with --ps)")
    pace_step_s: float = option(
        0.0, "emulated cluster speed: pad every step to this many seconds by sleeping, "
        "never by computing (0: unpaced)")
    outlier: Literal["none", "scale", "nan"] = option(
        "none", "fault injection (with --ps): corrupt what this cluster pushes: scale its pseudo-gradient, "
        "or send NaN")
    outlier_every: int = option(1, "inject on every N-th push (with --outlier)")
    outlier_scale: float = option(100.0, "the factor of --outlier scale")
    # Di-PS authentication (issue 34)
    ps_secret_file: str | None = option(
        None, "this cluster's Di-PS credential (or the run secret) file, written by h2 ps launch to "
        "<out>/secrets/ (default: $H2_PS_SECRET_FILE)", metavar="FILE")

    def __post_init__(self) -> None:
        if self.pace_step_s < 0:
            raise UserError(f"--pace-step-s must be 0 or positive, got {self.pace_step_s}")
        if self.pace_step_s > MAX_TIMEOUT_S:
            raise UserError(f"--pace-step-s must be at most {MAX_TIMEOUT_S:g} s, got {self.pace_step_s}")
        if not math.isfinite(self.outlier_scale):
            raise UserError(f"--outlier-scale must be a finite number, got {self.outlier_scale}")
        if self.outlier_every < 1:
            raise UserError(f"--outlier-every must be at least 1, got {self.outlier_every}")
        if self.outlier_every > MAX_STEPS:
            raise UserError(f"--outlier-every must be at most {MAX_STEPS}, got {self.outlier_every}")
        if self.ps is not None:
            parse_address(self.ps, "--ps")
            if not self.cluster_id:
                raise UserError("--ps needs --cluster-id (this cluster's id in the run)")
            if not (self.ps_secret_file or os.environ.get(SECRET_ENV)):
                raise UserError(f"--ps needs this cluster's credential: pass --ps-secret-file FILE or set {SECRET_ENV} "
                                f"(h2 ps launch writes them to <out>/secrets/)")
        elif self.cluster_id or self.outlier != "none" or self.pace_step_s or self.ps_secret_file:
            raise UserError("--cluster-id, --outlier, --pace-step-s and --ps-secret-file need --ps")


def parse_address(address: str, where: str) -> tuple[str, int]:
    """HOST:PORT into (host, port); a one-line UserError naming `where` otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise UserError(f"{where}: expected HOST:PORT, got {address!r}")
    return host, int(port)
