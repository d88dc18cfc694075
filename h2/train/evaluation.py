"""Evaluation on the held-out validation split: when a run evaluates, which batches, and the loss and
perplexity of one evaluation.

The split itself is h2.data's (`load_data`: training reads the data's head, validation its last
`--validation-fraction`), made the same with and without `--eval-every`, so switching evaluation on
changes no training step. An evaluation reads the same `eval_batches` global batches every time, the
first ones of the validation stream (its own fixed order, whatever the run's seed), forward only: no
gradients, no optimizer step, no random numbers drawn, and the training stream's position is untouched.
"""

from __future__ import annotations

import contextlib
import math

import torch

from h2.core.training import TrainConfig
from h2.data import SequenceStream
from h2.model.transformer import language_model_loss


def validation_batches(validation: SequenceStream, global_batch: int, batches: int) -> list[torch.Tensor]:
    """The `batches` global batches an evaluation reads: the first ones of the validation stream."""
    return [validation.sequences(index * global_batch, global_batch) for index in range(batches)]


def due(config: TrainConfig, step: int) -> bool:
    """Whether the run evaluates after optimizer step `step`."""
    return config.eval_every > 0 and step % config.eval_every == 0


def result(losses: list[float]) -> dict:
    """The fields an evaluation adds to its step's record: the mean loss over the batches and its
    perplexity."""
    loss = sum(losses) / len(losses)
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 700.0))}


@torch.no_grad()
def model_loss(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int, device: torch.device,
               precision=contextlib.nullcontext) -> float:
    """The mean token loss of `model` over `batch` (sequences of seq_len + 1 tokens), micro-batch by
    micro-batch as the training step runs it; `precision`: the context the training step's forward
    runs in (autocast under bf16)."""
    total = torch.zeros((), dtype=torch.float64)
    micro_batches = batch.split(micro_batch_size)
    for micro_batch in micro_batches:
        with precision():
            logits = model(micro_batch[:, :-1].to(device))
        total += language_model_loss(logits, micro_batch[:, 1:].to(device)).double().cpu()
    return float(total) / len(micro_batches)
