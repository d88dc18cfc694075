"""The single-device training loop."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import sys
import time

import numpy as np
import torch

from h2.data import SequenceStream, load_stdlib_corpus
from h2.data.corpus import Corpus
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.model.transformer import Transformer, language_model_loss
from h2.train.checkpoint import CheckpointDir
from h2.core.training import TRAJECTORY_FIELDS, TrainConfig
from h2.core.devices import resolve_device
from h2.train.lr_schedule import learning_rate
from h2.train.metrics import MetricsLog
from h2.train.progress import ProgressBar


def build_adamw(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norm weights are not decayed)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2))


def _prepare_out_dir(out_dir: str) -> None:
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f".write_test.{os.getpid()}")
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as error:
        raise UserError(f"output folder '{out_dir}' is not writable ({error.strerror or error})") from None


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    def __init__(self, model_config: ModelConfig, config: TrainConfig, out_dir: str, *,
                 resume: bool = False, overwrite: bool = False, explicit: frozenset[str] = frozenset(),
                 corpus: Corpus | None = None, show_progress: bool = True):
        _prepare_out_dir(out_dir)
        self.out_dir = out_dir
        self.checkpoints = CheckpointDir(out_dir)
        self.metrics = MetricsLog(out_dir)
        if not resume and self.checkpoints.steps():
            if not overwrite:
                raise UserError(f"output folder '{out_dir}' holds checkpoints of an earlier run: "
                                f"pass --resume to continue it or --overwrite to start over")
            self.checkpoints.remove_all()
        self.show_progress = show_progress
        checkpoint = self.checkpoints.load_latest() if resume else None
        if checkpoint is not None:
            config = self._adopt_trajectory(config, checkpoint, explicit)
            if checkpoint["model_config"] != model_config.to_dict():
                raise UserError(f"{self.checkpoints.path}: checkpoint was trained with model "
                                f"'{checkpoint['model_config']['name']}', which differs from '{model_config.name}'")
        if config.lr_decay_steps is None:
            config = dataclasses.replace(config, lr_decay_steps=config.steps)
        if config.seq_len is None:
            config = dataclasses.replace(config, seq_len=model_config.max_seq_len)
        if config.seq_len > model_config.max_seq_len:
            raise UserError(f"seq_len {config.seq_len} exceeds the model's max_seq_len {model_config.max_seq_len}")
        self.model_config, self.config = model_config, config
        self.device = resolve_device(config.device)

        torch.manual_seed(config.seed)
        self.model = Transformer(model_config).to(self.device)
        self.optimizer = build_adamw(self.model, config)
        self.stream = SequenceStream(corpus or load_stdlib_corpus(), config.seq_len, seed=config.seed)
        self.step, self.elapsed_s = 0, 0.0
        self.data_partition = (0, 1)  # (index, count): a Di-PS cluster reads its own part of every batch
        if checkpoint is not None:
            self._restore(checkpoint)
            self.metrics.truncate_after(self.step)
        else:
            self.metrics.reset()

    @staticmethod
    def _adopt_trajectory(config: TrainConfig, checkpoint: dict, explicit: frozenset[str]) -> TrainConfig:
        saved = checkpoint["train_config"]
        for name in TRAJECTORY_FIELDS:
            if name in explicit and getattr(config, name) != saved[name]:
                raise UserError(f"--{name.replace('_', '-')} {getattr(config, name)} differs from the checkpoint's "
                                f"{saved[name]}; a resumed run keeps its hyper-parameters")
        return dataclasses.replace(config, **{name: saved[name] for name in TRAJECTORY_FIELDS})

    def _restore(self, checkpoint: dict) -> None:
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.stream.load_state_dict(checkpoint["data"])
        _set_rng_state(checkpoint["rng"])
        self.step = checkpoint["step"]
        self.elapsed_s = checkpoint["elapsed_s"]

    def _state(self) -> dict:
        return {"step": self.step, "elapsed_s": self.elapsed_s, "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "data": self.stream.state_dict(),
                "lr_schedule": {"step": self.step, "lr": self.config.lr, "min_lr": self.config.min_lr,
                                "warmup_steps": self.config.warmup_steps,
                                "decay_steps": self.config.lr_decay_steps},
                "rng": _rng_state(), "model_config": self.model_config.to_dict(),
                "train_config": self.config.to_dict()}

    def save_checkpoint(self) -> str:
        return self.checkpoints.save(self.step, self._state(), keep=self.config.keep_checkpoints)

    def _autocast(self):
        if self.config.dtype == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self) -> dict:
        config = self.config
        started = time.perf_counter()
        lr = learning_rate(self.step, lr=config.lr, min_lr=config.min_lr,
                           warmup_steps=config.warmup_steps, decay_steps=config.lr_decay_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        index, count = self.data_partition
        batch = self.stream.next_batch(config.global_batch * count, index, count)
        loss_sum = torch.zeros((), device=self.device)
        for micro_batch in batch.split(config.micro_batch_size):
            inputs = micro_batch[:, :-1].to(self.device, non_blocking=True)
            targets = micro_batch[:, 1:].to(self.device, non_blocking=True)
            with self._autocast():
                logits = self.model(inputs)
            loss = language_model_loss(logits, targets) / config.micro_batches
            loss.backward()
            loss_sum += loss.detach()
        max_norm = config.grad_clip if config.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = loss_sum.item()
        step_time = time.perf_counter() - started
        self.step += 1
        self.elapsed_s += step_time
        tokens = config.global_batch * config.seq_len
        return {"step": self.step, "loss": loss_value, "lr": lr, "grad_norm": float(grad_norm),
                "tokens": tokens, "tokens_per_s": tokens / step_time, "step_time_s": step_time,
                "elapsed_s": self.elapsed_s}

    def run(self) -> list[dict]:
        """Train up to config.steps, checkpointing on schedule and at the end; returns this run's records."""
        if self.step >= self.config.steps:
            return []
        records = []
        bar = ProgressBar(self.config.steps, start=self.step) if self.show_progress else None
        while self.step < self.config.steps:
            record = self.train_step()
            if not math.isfinite(record["loss"]):
                raise FloatingPointError(f"loss became {record['loss']} at step {record['step']}")
            self.metrics.append(record)
            records.append(record)
            if bar:
                bar.update(self.step, loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")
            every = self.config.checkpoint_every
            if self.step == self.config.steps or (every and self.step % every == 0):
                self.save_checkpoint()
        return records


def train(model_config: ModelConfig, config: TrainConfig, out_dir: str, **kwargs) -> list[dict]:
    return Trainer(model_config, config, out_dir, **kwargs).run()


_SPARK = "▁▂▃▄▅▆▇█"


def summarize_losses(records: list[dict], points: int = 10) -> str:
    """A few lines describing a loss curve: start, end, reduction, minimum, a sparkline."""
    if not records:
        return "no steps were run (already at the requested step count)"
    losses = [r["loss"] for r in records]
    head = sum(losses[:10]) / len(losses[:10])
    tail = sum(losses[-10:]) / len(losses[-10:])
    best = min(range(len(losses)), key=losses.__getitem__)
    low, high = min(losses), max(losses)
    buckets = np.array_split(np.array(losses), min(len(losses), 40))
    spark = "".join(_SPARK[int((b.mean() - low) / (high - low + 1e-12) * (len(_SPARK) - 1))] for b in buckets)
    marks = sorted(set(np.linspace(0, len(records) - 1, min(points, len(records))).round().astype(int)))
    table = "  ".join(f"{records[i]['step']}:{records[i]['loss']:.3f}" for i in marks)
    return (f"loss {head:.4f} (mean of first {min(10, len(losses))} steps) -> {tail:.4f} "
            f"(mean of last {min(10, len(losses))}): {100 * (tail - head) / head:+.1f}%; "
            f"min {losses[best]:.4f} at step {records[best]['step']}\n"
            f"curve {spark}\n"
            f"steps {table}")
