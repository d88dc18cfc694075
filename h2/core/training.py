"""What a training job is, as plain data: hyper-parameters (`TrainConfig`), pipeline switches
(`PipelineOptions`) and where and how it runs (`RunOptions`).

Each field's `metadata["help"]` is its flag's help text: the command lines generate their flags
from these classes (h2.core.flags), and a job file (`--config job.yaml`) uses the same names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from h2.core.errors import UserError
from h2.core.schedule import SCHEDULES, ScheduleName

# Fields that define the run's trajectory: a resumed run must keep them.
TRAJECTORY_FIELDS = ("micro_batch_size", "micro_batches", "seq_len", "lr", "min_lr", "warmup_steps", "lr_decay_steps",
                     "weight_decay", "beta1", "beta2", "grad_clip", "dtype", "seed")

# Bounds of counts after which unbounded work or memory would follow (no real job comes near them).
MAX_STEPS = (1 << 31) - 1
MAX_MICRO_BATCHES = 1 << 16
MAX_GLOBAL_BATCH = 1 << 16  # sequences per step
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week
MAX_THREADS = 1024
MAX_PROCESSES = 1024
MAX_RESTARTS = 1000


def option(default, help: str, *, default_text: str | None = None, metavar: str | None = None):
    """A config field with its flag's help; `default_text` replaces the default in the help."""
    metadata = {"help": help}
    if default_text is not None:
        metadata["default_text"] = default_text
    if metavar is not None:
        metadata["metavar"] = metavar
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    steps: int = option(200, "train until this many optimizer steps in total")
    micro_batch_size: int = option(8, "sequences per micro-batch")
    micro_batches: int = option(1, "micro-batches accumulated per step (gradient accumulation)")
    seq_len: int | None = option(None, "tokens per sequence", default_text="the model's max_seq_len")
    lr: float = option(3e-3, "peak learning rate")
    min_lr: float = option(3e-4, "final learning rate of the cosine")
    warmup_steps: int = option(20, "linear warm-up steps")
    lr_decay_steps: int | None = option(None, "cosine horizon in steps", default_text="--steps of the first run")
    weight_decay: float = option(0.1, "AdamW weight decay on matrices")
    beta1: float = option(0.9, "AdamW beta1")
    beta2: float = option(0.95, "AdamW beta2")
    grad_clip: float = option(1.0, "max global gradient norm, 0 to disable")
    grad_clip_scope: Literal["global", "ministage"] = option(
        "global", "global: clip by the norm of every gradient; ministage: clip each ministage by its own "
        "gradients' norm, so its optimizer step runs right after its backward (a strategy with ministages; "
        "elsewhere the whole model is one ministage)")
    dtype: Literal["fp32", "bf16"] = option("fp32", "compute precision")
    seed: int = option(0, "seed for initialisation and data order")
    device: str = option("cpu", "torch device: cpu, cuda, cuda:N, dipu; with --strategy a device type for "
                         "every stage")
    checkpoint_every: int = option(100, "checkpoint every N steps, 0 for only at the end")
    keep_checkpoints: int = option(2, "how many checkpoints to keep")
    # Evaluation and logging (h2.train.evaluation, h2.train.loggers); none of them changes the trajectory.
    eval_every: int = option(0, "every N steps, the loss and perplexity on the held-out validation split; 0: never")
    eval_batches: int = option(
        4, "global batches of the validation split each evaluation reads (the same ones "
        "each time, from its start)")
    log_to: str | None = option(
        None, "also log the metrics to: tensorboard, wandb (offline), or both, "
        "comma-separated (under --out)", default_text="metrics.jsonl only", metavar="LIST")
    # ---- Hugging Face weights in (h2.model.hf_weights; `h2 export` writes them out) ----
    init_from: str | None = option(
        None, "start from the weights of a Hugging Face model folder (config.json and model.safetensors, or "
        "shards with their index; pickles are refused); the model is its config.json unless given, and "
        "must match it", metavar="DIR")
    # ---- data (h2.data): what the run trains on ----
    data: str | None = option(
        None, "training text: a file, a folder or a glob of .txt, .jsonl/.json or .parquet files, a folder "
        "saved by datasets' save_to_disk, or a folder prepared by `h2 data prepare`",
        default_text="the embedded standard-library corpus", metavar="PATH")
    data_field: str = option("text", "the field of .jsonl/.json/.parquet/datasets records that holds the text")
    tokenizer: str | None = option(
        None, "a Hugging Face tokenizer.json or a sentencepiece .model (or a folder "
        "holding one)", default_text="bytes", metavar="PATH")
    validation_fraction: float = option(
        0.01, "fraction of the data's tokens held out for validation "
        "(at least one sequence)")

    def __post_init__(self) -> None:
        checks = [("steps", 1 <= self.steps <= MAX_STEPS), ("micro_batch_size", self.micro_batch_size >= 1),
                  ("micro_batches", 1 <= self.micro_batches <= MAX_MICRO_BATCHES), ("lr", self.lr > 0),
                  ("min_lr", 0 <= self.min_lr <= self.lr), ("warmup_steps", 0 <= self.warmup_steps <= MAX_STEPS),
                  ("weight_decay", self.weight_decay >= 0), ("beta1", 0 <= self.beta1 < 1),
                  ("beta2", 0 <= self.beta2 < 1), ("grad_clip", self.grad_clip >= 0),
                  ("checkpoint_every", 0 <= self.checkpoint_every <= MAX_STEPS),
                  ("keep_checkpoints", 1 <= self.keep_checkpoints <= MAX_STEPS),
                  ("seed", 0 <= self.seed < 2**32)]  # numpy's generator takes a 32-bit seed
        checks += [("eval_every", 0 <= self.eval_every <= MAX_STEPS),
                   ("eval_batches", 1 <= self.eval_batches <= MAX_STEPS)]
        if self.seq_len is not None:
            checks.append(("seq_len", self.seq_len >= 1))
        if self.lr_decay_steps is not None:
            checks.append(("lr_decay_steps", 1 <= self.lr_decay_steps <= MAX_STEPS))
        for name in ("lr", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip"):
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"training option '{name}' must be a finite number, got {getattr(self, name)!r}")
        for name, ok in checks:
            if not ok:
                raise UserError(f"training option '{name}' out of range: {getattr(self, name)!r}")
        if self.micro_batches > 1 and self.global_batch > MAX_GLOBAL_BATCH:  # one huge micro-batch: the memory check
            raise UserError(f"training option 'micro_batches' out of range: {self.micro_batches} micro-batches of "
                            f"{self.micro_batch_size} sequences exceed {MAX_GLOBAL_BATCH} sequences per step (a "
                            f"step's batch is held in memory)")
        if self.dtype not in ("fp32", "bf16"):
            raise UserError(f"training option 'dtype' must be fp32 or bf16, got {self.dtype!r}")
        if self.grad_clip_scope not in ("global", "ministage"):
            raise UserError(
                f"training option 'grad_clip_scope' must be global or ministage, got {self.grad_clip_scope!r}")
        for name in self.loggers:
            if name not in LOGGERS:
                raise UserError(f"--log-to: unknown logger '{name}' (known: {', '.join(LOGGERS)})")

    @property
    def loggers(self) -> tuple[str, ...]:
        """The loggers --log-to names, in its order, each once."""
        names = (name.strip() for name in (self.log_to or "").split(","))
        return tuple(dict.fromkeys(name for name in names if name))

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.micro_batches

    def trajectory(self) -> dict:
        return {name: getattr(self, name) for name in TRAJECTORY_FIELDS}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


LOGGERS = ("tensorboard", "wandb")  # what --log-to accepts (h2.train.loggers)
P2P_BACKENDS = ("gloo", "dicomm")
STAGE_BACKENDS = ("auto", "gloo", "dicomm")
RESHARDING_MODES = ("sliced", "full")
OPTIMIZER_SHARDING = ("none", "zero1", "zero2")


@dataclass
class PipelineOptions:
    """How a HeteroPP pipeline runs (the strategy file says what it runs)."""
    p2p_backend: str = option("gloo", "backend of traffic across stages: gloo or dicomm")
    stage_backend: str = option(
        "auto", "backend of the TP/DP groups inside a stage: auto is the chip's (gloo on cpu, NCCL on cuda, "
        "DiComm on a vendor device)")
    resharding: Literal["sliced", "full"] = option("sliced",
                                                   "between stages: send/recv slices + all-gather, or full tensors")
    optimizer_sharding: Literal["none", "zero1", "zero2"] = option(
        "none", "ZeRO-1: shard AdamW state over each stage's data-parallel replicas; ZeRO-2: and gradients "
        "(a strategy's optimizer_sharding wins)")
    schedule: ScheduleName | None = option(
        None, "override the strategy's schedule (jeeves: generated from the --cluster's costs and links, or "
        "the strategy's own orders; gpipe: GPipe order, what ministages and offload run)",
        default_text="the strategy's")
    prefetch: bool = option(
        True, "post receives one compute action ahead (--no-prefetch: only where the "
        "schedule lists them)")
    offload_prefetch: bool = option(
        True, "under parameter offload, copy the next ministage's parameters to the device on a side thread "
        "while this one computes (two ministages resident; --no-offload-prefetch: copy when needed)")
    threads: int = option(1, "torch intra-op threads per rank")
    log_every: int = option(1, "print a metrics line every N steps")
    reshuffle_by_finish: bool = option(
        True, "with a strategy's reshuffle: true, send a stage's i-th finished micro-batch to the next stage's "
        "replica with the i-th most work left (--no-reshuffle-by-finish: micro-batch i there, a static map)")
    trace: str | None = option(
        None, "write a Chrome/Perfetto trace of every rank's spans (forward, backward, "
        "recompute, send, recv, all-reduce) to DIR/rank-<r>.json", metavar="DIR")
    rank_timeout: float = option(
        300.0, "seconds after which a rank that stopped responding (or a collective that did not complete) "
        "counts as lost: every other rank stops, naming it; a rank that died is named at once")

    def __post_init__(self) -> None:
        for name, choices in (("p2p_backend", P2P_BACKENDS), ("stage_backend", STAGE_BACKENDS),
                              ("resharding", RESHARDING_MODES), ("optimizer_sharding",
                                                                 OPTIMIZER_SHARDING), ("schedule", (None, *SCHEDULES))):
            if getattr(self, name) not in choices:
                choices = [c for c in choices if c is not None]
                raise UserError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)}, "
                                f"got '{getattr(self, name)}'")
        for name in ("threads", "log_every"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.rank_timeout > 0:
            raise UserError(f"--rank-timeout must be positive, got {self.rank_timeout}")
        if self.rank_timeout > MAX_TIMEOUT_S:
            raise UserError(f"--rank-timeout must be at most {MAX_TIMEOUT_S:g} s, got {self.rank_timeout}")
        for name, most in (("threads", MAX_THREADS), ("log_every", MAX_STEPS)):
            if getattr(self, name) > most:
                raise UserError(f"--{name.replace('_', '-')} must be at most {most}, got {getattr(self, name)}")


@dataclass
class RunOptions:
    """Which model, where its output goes, and how this invocation treats an earlier run."""
    preset: str | None = option(None, "model preset: tiny, small, h2-100b", default_text="tiny")
    model_config: str | None = option(None, "a model YAML (fields of ModelConfig, or preset + overrides)",
                                      metavar="YAML")
    strategy: str | None = option(
        None, "a HeteroPP strategy YAML: run the pipeline on local processes "
        "(torchrun --standalone)", metavar="YAML")
    nproc: int | None = option(None, "processes for --strategy", default_text="sum of tp * dp over stages")
    cluster: str | None = option(
        None, "a cluster YAML for --strategy: each rank runs as its stage's chip type "
        "(emulated on the dipu device where the chip has an `emulation:` section), "
        "cross-stage traffic is paced to its link classes, and a cluster of several "
        "nodes runs each node in its own network namespace (when root)", metavar="YAML")
    out: str | None = option(None, "output folder for metrics.jsonl and checkpoints/", default_text="runs/<model>",
                             metavar="DIR")
    resume: bool = option(False, "continue from the latest checkpoint in --out")
    overwrite: bool = option(False, "start over in an --out that holds an earlier run")
    max_restarts: int | None = option(
        None, "with --strategy: after a rank fails, restart the job's ranks from the last checkpoint up to N "
        "times (torchrun's elastic restarts)", default_text="0")
    quiet: bool = option(False, "no progress bar")
    write_job: str | None = option(
        None, "with --strategy: check and resolve the job as usual, write it as "
        "DIR/job.yaml and exit without starting ranks; start them by hand with "
        "torchrun -m h2.cli.rank --job DIR/job.yaml", metavar="DIR")

    def __post_init__(self) -> None:
        for name in ("preset", "model_config", "strategy", "cluster", "out", "write_job"):
            if getattr(self, name) == "":
                raise UserError(f"--{name.replace('_', '-')} is empty")
        if self.preset is not None and self.model_config is not None:
            raise UserError("give a model as --preset or as --model-config, not both")
        if self.nproc is not None and self.nproc < 1:
            raise UserError(f"--nproc must be at least 1, got {self.nproc}")
        if self.nproc is not None and self.nproc > MAX_PROCESSES:
            raise UserError(f"--nproc must be at most {MAX_PROCESSES}, got {self.nproc}")
        if self.max_restarts is not None and self.max_restarts < 0:
            raise UserError(f"--max-restarts must be at least 0, got {self.max_restarts}")
        if self.max_restarts is not None and self.max_restarts > MAX_RESTARTS:
            raise UserError(f"--max-restarts must be at most {MAX_RESTARTS}, got {self.max_restarts}")
        if self.resume and self.overwrite:
            raise UserError("--resume and --overwrite exclude each other")
