"""The training loop of one HeteroPP rank: data, learning-rate schedule, metrics and checkpoints around
the runtime's PipelineEngine (heteropp.engine), which owns the stage, its groups and one optimizer step.

Only the first rank of the last stage writes `metrics.jsonl` (the reference trainer's format plus
`cross_stage_bytes`, every `log_every` steps the peak device memory per stage, and with `--eval-every`
the validation loss of a forward-only pass through the pipeline that every rank takes part in,
h2.train.evaluation) and feeds the `--log-to` loggers. Checkpoints are the reference trainer's format
(h2.train.checkpoint): every rank writes its shard (its stage's parameters, TP pieces named as in the
whole model, the optimizer state it owns, ZeRO-1 shards included, and its RNG states); once all are on
disk rank 0 completes
the checkpoint with the manifest (strategy, step, data position, hyper-parameters). The output
folder follows the reference trainer's rule (h2.train.run_state). A resumed run under the same
strategy continues bit for bit; under another strategy with the same model, sequence length and
global batch (layers moved between stages, other TP or DP sizes, ZeRO-1 on or off) each rank
assembles its pieces from the old shards; anything else is refused in one line.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch
import torch.distributed as dist

from h2.core.errors import UserError
from h2.core.links import PeerLinks
from h2.core.training import TRAJECTORY_FIELDS, PipelineOptions, TrainConfig
from h2.data import adopt_data_options, load_training_data, save_run_tokenizer
from h2.data.corpus import Corpus
from h2.train import evaluation
from h2.train.checkpoint import (
    ADAMW_COPIES,
    Checkpoint,
    cut,
    json_value,
    piece_layout,
    rng_state,
    set_rng_state,
)
from h2.train.loggers import open_loggers
from h2.train.lr_schedule import learning_rate
from h2.train.memory_check import check_rank_fits
from h2.train.run_state import PIPELINE, RunStart
from heteropp.engine import PipelineEngine, train_config_for

# The strategy fixes the batch shape; a resumed pipeline keeps the other hyper-parameters.
PIPELINE_TRAJECTORY = tuple(name for name in TRAJECTORY_FIELDS if name not in ("micro_batch_size", "micro_batches"))


def _check_batch_shape(strategy, config: TrainConfig, checkpoint: Checkpoint, source: str) -> None:
    """A resumed pipeline must draw the same sequences per step as the run it continues."""
    saved = checkpoint.manifest
    seq_len = train_config_for(strategy, config).seq_len
    if seq_len != saved["seq_len"]:
        raise UserError(f"{source}: seq_len {seq_len} differs from the checkpoint's {saved['seq_len']} "
                        f"({checkpoint.folder}); a resumed run keeps its sequence length")
    global_batch = strategy.micro_batch_sequences * strategy.micro_batches
    if global_batch != saved["global_batch"]:
        raise UserError(f"{source}: a step of {global_batch} sequences (dp * micro_batch_size * micro_batches = "
                        f"{strategy.dp} * {strategy.micro_batch_size} * {strategy.micro_batches}) differs from the "
                        f"checkpoint's {saved['global_batch']} ({checkpoint.folder}); a resumed run keeps its batch")


def checkpoint_bytes(strategy, model_config) -> int:
    """About how many bytes one checkpoint of a pipeline run takes: every stage's parameters (fp32) once
    per data-parallel replica, and AdamW's two moments beside them."""
    last, total = len(strategy.stages) - 1, 0
    for index, stage in enumerate(strategy.stages):
        parameters = stage.layers * model_config.layer_params()
        if index == 0:
            parameters += model_config.embedding_params()
        if index == last:
            head = model_config.head_params() or (model_config.embedding_params() if last else 0)
            parameters += model_config.final_norm_params() + head
        total += strategy.stage_dp(index) * parameters
    return ADAMW_COPIES * 4 * total


def pipeline_start(strategy, config: TrainConfig, out_dir: str, *, resume: bool = False, overwrite: bool = False,
                   restarted: bool = False, explicit: frozenset[str] = frozenset(),
                   source: str = "strategy") -> tuple[RunStart, TrainConfig]:
    """Where a pipeline run starts in `out_dir` and the config it runs with, every refusal made
    (h2.train.run_state); nothing in the folder has changed yet. `restarted`: this job's ranks were
    restarted after a failure."""
    start = RunStart(out_dir, resume=resume, overwrite=overwrite, restarted=restarted)
    start.check_continues(PIPELINE, strategy.model_config(source))
    config = start.adopt_trajectory(config, explicit, PIPELINE_TRAJECTORY)
    start.check_room(checkpoint_bytes(strategy, strategy.model_config(source)), config.keep_checkpoints)
    if start.checkpoint is not None:
        _check_batch_shape(strategy, config, start.checkpoint, source)
    return start, config


def data_cache_dir(out_dir: str | None) -> str | None:
    """Where a run's data prepared on the fly is kept (h2.data.load_data); None: in memory."""
    return os.path.join(out_dir, "data_cache") if out_dir is not None else None


class PipelineTrainer:

    def __init__(self, strategy, config: TrainConfig, out_dir: str | None, options: PipelineOptions | None = None,
                 corpus: Corpus | None = None, source: str = "strategy", links: PeerLinks | None = None,
                 chip_labels: dict[str, str] | None = None, *, resume: bool = False, overwrite: bool = False,
                 restarted: bool = False, explicit: frozenset[str] = frozenset()):
        """`out_dir` None: no metrics, no checkpoints (benchmarks); the other keywords: `pipeline_start`."""
        start = None
        if out_dir is not None:
            start, config = pipeline_start(strategy, config, out_dir, resume=resume, overwrite=overwrite,
                                           restarted=restarted, explicit=explicit, source=source)
        checkpoint = start.checkpoint if start else None
        config = adopt_data_options(config, checkpoint and checkpoint.manifest["train_config"], explicit)
        self.strategy = strategy
        check_rank_fits(strategy, config, dist.get_rank(), chip_labels)
        self.engine = PipelineEngine(strategy, config, options, source=source, links=links, chip_labels=chip_labels)
        self.config = self.engine.config
        self.model_config = self.engine.model_config
        self.topology, self.rank = self.engine.topology, self.engine.rank
        self.writes_metrics = self.engine.reports_loss
        self.stream, self.validation, self.tokenizer = load_training_data(
            self.config, self.model_config, cache_dir=data_cache_dir(out_dir), corpus=corpus)
        self.validation_batches = evaluation.validation_batches(
            self.validation, self.engine.global_batch, self.config.eval_batches) if self.config.eval_every > 0 else []
        self.out_dir = out_dir
        self.step, self.elapsed_s = 0, 0.0
        self.host_cpu_s = 0.0  # this process's CPU time inside steps: the host work its chip needed
        self.data_partition = (0, 1)  # (index, count): a Di-PS cluster reads its own part of every batch
        self.checkpoints = start.checkpoints if start else None
        self.metrics = start.metrics if start and self.writes_metrics else None
        self.resumed_from, self.resharded = checkpoint, False
        self._layouts = {
            name: piece_layout(dim, self.engine.place.tp_index, self.engine.stage_info.tp)
            if dim is not None else piece_layout(None) for name, _, dim in self.engine.parameter_pieces()
        }
        if checkpoint is not None:
            self._restore(checkpoint)
        if start is not None and self.writes_metrics:
            start.prepare()
            self.metrics.attach(open_loggers(self.config.loggers, out_dir, self.step, self.config.to_dict()))
            save_run_tokenizer(self.tokenizer, out_dir)

    # ---- checkpoints -----------------------------------------------------------------------
    def _same_layout(self, checkpoint: Checkpoint) -> bool:
        return checkpoint.manifest.get("strategy") == json_value(self.strategy.to_dict())

    def _restore(self, checkpoint: Checkpoint) -> None:
        with torch.no_grad():
            for name, param, _ in self.engine.parameter_pieces():
                param.copy_(cut(checkpoint.parameter(name), self._layouts[name]))

        def owned_state(name: str) -> dict:
            return {
                key: cut(value, self._layouts[name]) if torch.is_tensor(value) and value.dim() else value
                for key, value in checkpoint.optimizer_state(name).items()
            }

        self.engine.optimizer.load_state_by_name(owned_state)
        self.stream.load_state_dict(checkpoint.manifest["data"])
        self.step, self.elapsed_s = checkpoint.step, float(checkpoint.manifest["elapsed_s"])
        if self._same_layout(checkpoint):
            set_rng_state(checkpoint.shard(self.rank)["rng"])
        else:  # no rank of the old layout corresponds to this one: a seeded stream of its own
            self.resharded = True
            torch.manual_seed(self.config.seed + 1_000_003 * (self.step + 1) + self.rank)

    def _shard(self) -> dict:
        parameters = {name: param.detach() for name, param, _ in self.engine.parameter_pieces()}
        place = self.engine.place
        return {
            "place": {"rank": self.rank, "stage": place.stage, "dp_index": place.dp_index,
                      "tp_index": place.tp_index}, "parameters": parameters, "layout": self._layouts,
            "optimizer": self.engine.optimizer.state_by_name(), "rng": rng_state()
        }

    def _manifest(self) -> dict:
        return {
            "kind": PIPELINE, "step": self.step, "elapsed_s": self.elapsed_s, "world_size": self.topology.world_size,
            "model_config": self.model_config.to_dict(), "train_config": self.config.to_dict(),
            "data": self.stream.state_dict(), "global_batch": self.engine.global_batch, "seq_len": self.config.seq_len,
            "strategy": json_value(
                self.strategy.to_dict()), "optimizer_sharding": self.engine.options.optimizer_sharding, "ranks": [{
                    "rank": rank, "stage": place.stage, "chip": self.topology.stages[place.stage].chip,
                    "dp_index": place.dp_index, "tp_index": place.tp_index
                } for rank, place in ((r, self.topology.place(r)) for r in range(self.topology.world_size))]
        }

    def save_checkpoint(self) -> None:
        """Every rank writes its shard; once all are on disk, rank 0 writes the manifest (the commit)."""
        self.checkpoints.write_shard(self.step, self.rank, self._shard())
        self.engine.barrier()
        if self.rank == 0:
            self.checkpoints.commit(self.step, self._manifest(), keep=self.config.keep_checkpoints)

    # ---- the loop --------------------------------------------------------------------------
    def train_step(self) -> dict:
        config = self.config
        started, cpu_started = time.perf_counter(), time.process_time()
        lr = learning_rate(self.step, lr=config.lr, min_lr=config.min_lr, warmup_steps=config.warmup_steps,
                           decay_steps=config.lr_decay_steps)
        index, count = self.data_partition
        result = self.engine.step(self.stream.next_batch(self.engine.global_batch * count, index, count), lr)
        step_time = time.perf_counter() - started
        self.host_cpu_s += time.process_time() - cpu_started
        self.step += 1
        self.elapsed_s += step_time
        tokens = self.engine.global_batch * config.seq_len
        record = {
            "step": self.step, "loss": float(result.loss), "lr": lr, "grad_norm": result.grad_norm, "tokens": tokens,
            "tokens_per_s": tokens / step_time, "step_time_s": step_time, "elapsed_s": self.elapsed_s,
            "cross_stage_bytes": result.cross_stage_bytes
        }
        if evaluation.due(config, self.step):
            record.update(self.evaluate())
        if self._reports_memory():
            memory = self.engine.device_report()  # a collective: every rank takes part
            record["peak_allocated_bytes"] = [row["peak_allocated_bytes"] for row in memory]
        if self.metrics is not None:
            self.metrics.append(record)
        every = config.checkpoint_every
        if self.checkpoints is not None and (self.step == config.steps or (every and self.step % every == 0)):
            self.save_checkpoint()
        return record

    def evaluate(self) -> dict:
        """The validation loss and perplexity of the pipeline's model as it is now, forward only through
        the pipeline (every rank takes part; meaningful on the last stage)."""
        return evaluation.result([float(self.engine.evaluate(batch)) for batch in self.validation_batches])

    def _reports_memory(self) -> bool:
        """Whether this step's record gets the peak device memory per stage: every `log_every` steps and
        the last, in a run that logs (the progress line shows it)."""
        every = self.engine.options.log_every
        return self.out_dir is not None and (self.step % every == 0 or self.step == self.config.steps)

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
        self.engine.release()
        return records
