"""The training loop of one HeteroPP rank: data, learning-rate schedule and metrics around the
runtime's PipelineEngine (heteropp.engine), which owns the stage, its groups and one optimizer step.

Only the first rank of the last stage writes `metrics.jsonl` (the reference trainer's format plus
`cross_stage_bytes`).
"""

from __future__ import annotations

import json
import math
import os
import time

from h2.core.links import RankLinks
from h2.core.training import PipelineOptions, TrainConfig
from h2.data import SequenceStream, load_stdlib_corpus
from h2.data.corpus import Corpus
from h2.train.lr_schedule import learning_rate
from h2.train.metrics import MetricsLog
from heteropp.engine import PipelineEngine


class PipelineTrainer:
    def __init__(self, strategy, config: TrainConfig, out_dir: str | None, options: PipelineOptions | None = None,
                 corpus: Corpus | None = None, source: str = "strategy", links: RankLinks | None = None,
                 chip_labels: dict[str, str] | None = None):
        self.engine = PipelineEngine(strategy, config, options, source=source, links=links, chip_labels=chip_labels)
        self.config = self.engine.config
        self.model_config = self.engine.model_config
        self.topology, self.rank = self.engine.topology, self.engine.rank
        self.writes_metrics = self.engine.reports_loss
        self.stream = SequenceStream(corpus or load_stdlib_corpus(), self.config.seq_len, seed=self.config.seed)
        self.step, self.elapsed_s = 0, 0.0
        self.host_cpu_s = 0.0           # this process's CPU time inside steps: the host work its chip needed
        self.metrics = None
        if self.writes_metrics and out_dir is not None:
            os.makedirs(out_dir, exist_ok=True)
            self.metrics = MetricsLog(out_dir)
            self.metrics.reset()

    def train_step(self) -> dict:
        config = self.config
        started, cpu_started = time.perf_counter(), time.process_time()
        lr = learning_rate(self.step, lr=config.lr, min_lr=config.min_lr, warmup_steps=config.warmup_steps,
                           decay_steps=config.lr_decay_steps)
        result = self.engine.step(self.stream.next_batch(self.engine.global_batch), lr)
        step_time = time.perf_counter() - started
        self.host_cpu_s += time.process_time() - cpu_started
        self.step += 1
        self.elapsed_s += step_time
        tokens = self.engine.global_batch * config.seq_len
        record = {"step": self.step, "loss": float(result.loss), "lr": lr, "grad_norm": result.grad_norm,
                  "tokens": tokens, "tokens_per_s": tokens / step_time, "step_time_s": step_time,
                  "elapsed_s": self.elapsed_s, "cross_stage_bytes": result.cross_stage_bytes}
        if self.metrics is not None:
            self.metrics.append(record)
        return record

    def stage_report(self) -> list[dict]:
        """Per stage: peak device memory, emulated kernel pacing and the host CPU its ranks spent in
        steps (PipelineEngine.device_report); every rank calls it, the metrics rank also writes it to
        `stage_report.json` beside the metrics."""
        report = self.engine.device_report(self.host_cpu_s)
        if self.metrics is not None:
            path = os.path.join(os.path.dirname(self.metrics.path), "stage_report.json")
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(report, handle, indent=1)
        return report

    def run(self) -> list[dict]:
        records = []
        while self.step < self.config.steps:
            record = self.train_step()
            if self.engine.is_last and not math.isfinite(record["loss"]):
                raise FloatingPointError(f"loss became {record['loss']} at step {record['step']}")
            records.append(record)
        return records

