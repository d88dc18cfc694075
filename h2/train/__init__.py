"""The single-device reference trainer: AdamW, warm-up + cosine LR, clipping, fp32/bf16,
gradient accumulation, atomic checkpoints with exact resume, JSONL metrics and progress.

Every parallel run (HeteroPP) is checked against this trainer's loss on the same data.
"""

from h2.train.config import TrainConfig
from h2.train.trainer import Trainer, train

__all__ = ["TrainConfig", "Trainer", "train"]
