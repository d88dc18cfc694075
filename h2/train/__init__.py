"""The trainers (product layer): the single-device reference trainer (AdamW, warm-up + cosine LR,
clipping, fp32/bf16, gradient accumulation, atomic checkpoints with exact resume, JSONL metrics and
progress) and the pipeline trainer that drives a HeteroPP engine on each rank (h2.train.pipeline);
around them the held-out evaluation (h2.train.evaluation), the loggers beside metrics.jsonl
(h2.train.loggers) and text generation from a run's checkpoint (h2.train.generation).

Every parallel run (HeteroPP) is checked against the reference trainer's loss on the same data.
May import every layer below (h2.core, h2.model, h2.data, ditorch, dicomm, heteropp, h2.ps); never
heteroauto, h2.launch or h2.cli.
"""

from h2.core.training import TrainConfig
from h2.train.trainer import Trainer, train

__all__ = ["TrainConfig", "Trainer", "train"]
