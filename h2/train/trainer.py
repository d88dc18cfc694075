"""The single-device training loop."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time

import numpy as np
import torch

from h2.core.devices import resolve_device
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.core.training import TrainConfig
from h2.data import adopt_data_options, load_training_data, save_run_tokenizer
from h2.data.corpus import Corpus
from h2.model.hf_weights import check_init_from, copy_into, load_hf_parameters
from h2.model.transformer import Transformer, language_model_loss
from h2.train import evaluation
from h2.train.checkpoint import (
    ADAMW_COPIES,
    load_optimizer_state_by_name,
    optimizer_state_by_name,
    piece_layout,
    rng_state,
    set_rng_state,
)
from h2.train.loggers import check_available as check_loggers_available
from h2.train.loggers import open_loggers
from h2.train.lr_schedule import learning_rate
from h2.train.memory_check import check_training_fits
from h2.train.progress import ProgressBar, validation_fields
from h2.train.run_state import SINGLE_DEVICE, RunStart


def build_adamw(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norm weights are not decayed)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2))


def checkpoint_bytes(model: torch.nn.Module) -> int:
    """About how many bytes one checkpoint of `model` takes: its parameters and AdamW's two moments."""
    return ADAMW_COPIES * sum(param.numel() * param.element_size() for param in model.parameters())


class Trainer:

    def __init__(self, model_config: ModelConfig, config: TrainConfig, out_dir: str, *, resume: bool = False,
                 overwrite: bool = False, explicit: frozenset[str] = frozenset(), corpus: Corpus | None = None,
                 show_progress: bool = True):
        check_loggers_available(config.loggers)  # a missing package, before the folder changes
        self.out_dir = out_dir
        if config.init_from:  # before the run folder is touched
            check_init_from(model_config, config.init_from)
        start = RunStart(out_dir, resume=resume, overwrite=overwrite)
        start.check_continues(SINGLE_DEVICE, model_config)
        config = start.adopt_trajectory(config, explicit)
        config = adopt_data_options(config, start.checkpoint and start.checkpoint.manifest["train_config"], explicit)
        self.checkpoints, self.metrics = start.checkpoints, start.metrics
        self.show_progress = show_progress
        if config.lr_decay_steps is None:
            config = dataclasses.replace(config, lr_decay_steps=config.steps)
        if config.seq_len is None:
            config = dataclasses.replace(config, seq_len=model_config.max_seq_len)
        if config.seq_len > model_config.max_seq_len:
            raise UserError(f"seq_len {config.seq_len} exceeds the model's max_seq_len {model_config.max_seq_len}")
        self.model_config, self.config = model_config, config
        self.device = resolve_device(config.device)
        check_training_fits(model_config, config, self.device)
        self.stream, self.validation, self.tokenizer = load_training_data(config, model_config, cache_dir=os.path.join(
            out_dir, "data_cache"), corpus=corpus, progress=show_progress)

        torch.manual_seed(config.seed)
        self.model = Transformer(model_config).to(self.device)
        start.check_room(checkpoint_bytes(self.model), config.keep_checkpoints)
        if config.init_from and start.checkpoint is None:
            copy_into(self.model, load_hf_parameters(model_config, config.init_from))
        self.optimizer = build_adamw(self.model, config)
        self.parameter_names = {id(param): name for name, param in self.model.named_parameters()}
        self.validation_batches = evaluation.validation_batches(self.validation, config.global_batch,
                                                                config.eval_batches) if config.eval_every > 0 else []
        self.step, self.elapsed_s = 0, 0.0
        self.data_partition = (0, 1)  # (index, count): a Di-PS cluster reads its own part of every batch
        if start.checkpoint is not None:
            self._restore(start.checkpoint)
        start.prepare()
        self.metrics.attach(open_loggers(config.loggers, out_dir, self.step, self.config.to_dict()))
        save_run_tokenizer(self.tokenizer, out_dir)

    def _restore(self, checkpoint) -> None:
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(checkpoint.parameter(name))
        load_optimizer_state_by_name(self.optimizer, self.parameter_names, checkpoint.optimizer_state)
        self.stream.load_state_dict(checkpoint.manifest["data"])
        set_rng_state(checkpoint.shard(0)["rng"])
        self.step = checkpoint.step
        self.elapsed_s = checkpoint.manifest["elapsed_s"]

    def _shard(self) -> dict:
        parameters = {name: param.detach() for name, param in self.model.named_parameters()}
        return {
            "parameters": parameters, "layout": {name: piece_layout(None) for name in parameters},
            "optimizer": optimizer_state_by_name(self.optimizer, self.parameter_names), "rng": rng_state()
        }

    def _manifest(self) -> dict:
        return {
            "kind": SINGLE_DEVICE, "step": self.step, "elapsed_s": self.elapsed_s, "world_size": 1,
            "model_config": self.model_config.to_dict(), "train_config": self.config.to_dict(),
            "data": self.stream.state_dict(), "global_batch": self.config.global_batch, "seq_len": self.config.seq_len
        }

    def save_checkpoint(self) -> str:
        self.checkpoints.write_shard(self.step, 0, self._shard())
        return self.checkpoints.commit(self.step, self._manifest(), keep=self.config.keep_checkpoints)

    def _autocast(self):
        if self.config.dtype == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self) -> dict:
        config = self.config
        started = time.perf_counter()
        lr = learning_rate(self.step, lr=config.lr, min_lr=config.min_lr, warmup_steps=config.warmup_steps,
                           decay_steps=config.lr_decay_steps)
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
        return {
            "step": self.step, "loss": loss_value, "lr": lr, "grad_norm": float(grad_norm), "tokens": tokens,
            "tokens_per_s": tokens / step_time, "step_time_s": step_time, "elapsed_s": self.elapsed_s
        } | (self.evaluate() if evaluation.due(config, self.step) else {})

    def evaluate(self) -> dict:
        """The validation loss and perplexity of the model as it is now (h2.train.evaluation)."""
        return evaluation.result([
            evaluation.model_loss(self.model, batch, self.config.micro_batch_size, self.device, self._autocast)
            for batch in self.validation_batches
        ])

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
                shown = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}"} | validation_fields(record)
                bar.update(self.step, **shown)
            every = self.config.checkpoint_every
            if self.step == self.config.steps or (every and self.step % every == 0):
                self.save_checkpoint()
        return records


def train(model_config: ModelConfig, config: TrainConfig, out_dir: str, **kwargs) -> list[dict]:
    trainer = Trainer(model_config, config, out_dir, **kwargs)
    try:
        return trainer.run()
    finally:
        trainer.metrics.close()


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
