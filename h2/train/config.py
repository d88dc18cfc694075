"""Training hyper-parameters as plain data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from h2.errors import UserError

# Fields that define the run's trajectory: a resumed run must keep them.
TRAJECTORY_FIELDS = ("micro_batch_size", "micro_batches", "seq_len", "lr", "min_lr", "warmup_steps",
                     "lr_decay_steps", "weight_decay", "beta1", "beta2", "grad_clip", "dtype", "seed")


@dataclass
class TrainConfig:
    steps: int = 200
    micro_batch_size: int = 8
    micro_batches: int = 1          # gradient accumulation: micro-batches per optimizer step
    seq_len: int | None = None      # default: the model's max_seq_len
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    lr_decay_steps: int | None = None  # cosine horizon; default: steps at the run's start
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0          # max global gradient norm; 0 disables clipping
    dtype: Literal["fp32", "bf16"] = "fp32"
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 100     # 0: only at the end
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        checks = [("steps", self.steps >= 1), ("micro_batch_size", self.micro_batch_size >= 1),
                  ("micro_batches", self.micro_batches >= 1), ("lr", self.lr > 0),
                  ("min_lr", 0 <= self.min_lr <= self.lr), ("warmup_steps", self.warmup_steps >= 0),
                  ("weight_decay", self.weight_decay >= 0), ("beta1", 0 <= self.beta1 < 1),
                  ("beta2", 0 <= self.beta2 < 1), ("grad_clip", self.grad_clip >= 0),
                  ("checkpoint_every", self.checkpoint_every >= 0),
                  ("keep_checkpoints", self.keep_checkpoints >= 1)]
        if self.seq_len is not None:
            checks.append(("seq_len", self.seq_len >= 1))
        if self.lr_decay_steps is not None:
            checks.append(("lr_decay_steps", self.lr_decay_steps >= 1))
        for name, ok in checks:
            if not ok:
                raise UserError(f"training option '{name}' out of range: {getattr(self, name)!r}")
        if self.dtype not in ("fp32", "bf16"):
            raise UserError(f"training option 'dtype' must be fp32 or bf16, got {self.dtype!r}")

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.micro_batches

    def trajectory(self) -> dict:
        return {name: getattr(self, name) for name in TRAJECTORY_FIELDS}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
