"""A cluster of a Di-PS run: the single-device trainer with a sync point every H inner steps.

`run_with_ps` joins the run, pulls the global model, then trains: every step padded to the emulated
speed (`--pace-step-s`), every H-th step followed by a sync point (h2.ps.client), after which the
pulled global model is scored on a fixed held-out sample. `<out>/ps.jsonl` gets one record per sync
point: status, versions, push/wait/pull seconds, bytes, the held-out loss of the pulled model.
The cluster reads its own part of every batch (partition i of n, n = the run's clusters), or, when the
run file sets chunks_per_cluster, the chunks of data the master hands it one after another (h2.ps.chunks);
it stops when the master reports the run's token budget spent, or at --steps.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch

from h2.core.dips import PSOptions
from h2.core.errors import UserError
from h2.core.model_config import resolve_model
from h2.data import SequenceStream
from h2.model.transformer import language_model_loss
from h2.ps.chunks import ChunkStream
from h2.ps.client import ClusterClient, Outliers, SyncResult, sync_retrying
from h2.train.pacing import Pacer
from h2.train.progress import ProgressBar

HELD_OUT_SEED = 1_000_003


def held_out_batch(stream: SequenceStream, sequences: int) -> torch.Tensor:
    """A fixed sample of the held-out split (h2.data.load_data), the same for every cluster (its own
    seeded order)."""
    return SequenceStream(stream.corpus, stream.seq_len, seed=HELD_OUT_SEED).sequences(0, sequences)


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, batch: torch.Tensor, device: torch.device) -> float:
    model.eval()
    loss = language_model_loss(model(batch[:, :-1].to(device)), batch[:, 1:].to(device)).item()
    model.train()
    return loss


class SyncLog:

    def __init__(self, out_dir: str, append: bool):
        self.path = os.path.join(out_dir, "ps.jsonl")
        if not append:
            open(self.path, "w").close()

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def run_with_ps(trainer, options: PSOptions, *, show_progress: bool = True, log=print) -> list[dict]:
    """Train `trainer` (h2.train.trainer.Trainer) as cluster `options.cluster_id` of the run at `options.ps`."""

    def say(message: str) -> None:
        log(f"[cluster {options.cluster_id}] {message}")

    client = ClusterClient(options.ps, options.cluster_id, log=say, outliers=Outliers(
        options.outlier, options.outlier_every, options.outlier_scale), secret_file=options.ps_secret_file)
    if resolve_model(client.model).architecture() != trainer.model_config.architecture():
        raise UserError(f"--ps {options.ps}: the run trains model '{client.model}', this trainer "
                        f"'{trainer.model_config.name}'")
    if client.chunks:
        trainer.stream = ChunkStream(trainer.stream, client.next_chunk)
    else:
        trainer.data_partition = (client.partition, client.partitions)
    tensors = dict(trainer.model.named_parameters())
    pacer = Pacer(options.pace_step_s)
    sync_log = SyncLog(trainer.out_dir, append=trainer.step > 0)
    held_out = held_out_batch(trainer.validation, client.eval_sequences) if client.eval_sequences else None
    inner_steps = client.inner_steps

    def record_sync(result: SyncResult) -> None:
        eval_loss = held_out_loss(trainer.model, held_out, trainer.device) if (
            held_out is not None and result.status in ("applied", "rejected", "rejoined", "joined")) else None
        entry = {
            "step": trainer.step, "time": time.time(), **result.__dict__, "eval_loss": eval_loss,
            "pacing_overruns": pacer.overruns
        }
        sync_log.append(entry)
        shown = f"; held-out loss {eval_loss:.4f}" if eval_loss is not None else ""
        why = f" ({result.reason})" if result.reason else ""
        say(f"step {trainer.step}: {result.status} -> version {result.version}{why}; push {result.push_s:.3f} s, "
            f"wait {result.wait_s:.3f} s, pull {result.pull_s:.3f} s{shown}")

    if options.pace_step_s:
        say(f"emulated cluster speed: every step padded to {options.pace_step_s:g} s by sleeping")
    started = time.perf_counter()
    nbytes = client.start(tensors, fresh=trainer.step == 0)
    record_sync(
        SyncResult("joined", client.version, pull_s=time.perf_counter() - started, bytes_pulled=nbytes,
                   finished=client.finished))
    records, tokens, losses = [], 0, []
    bar = ProgressBar(trainer.config.steps, start=trainer.step) if show_progress else None
    try:
        while trainer.step < trainer.config.steps and not client.finished:
            step_started = time.perf_counter()
            record = trainer.train_step()
            compute_s = pacer.pad(step_started)
            if not math.isfinite(record["loss"]):
                say(f"loss became {record['loss']} at step {record['step']}")
            record.update(step_time_s=time.perf_counter() - step_started, compute_s=compute_s,
                          tokens_per_s=record["tokens"] / (time.perf_counter() - step_started))
            trainer.metrics.append(record)
            records.append(record)
            tokens += record["tokens"]
            losses.append(record["loss"])
            if trainer.step % inner_steps == 0:
                mean_loss = sum(losses) / len(losses)
                result = sync_retrying(lambda: client.sync(tensors, tokens, mean_loss), client.sync_retries,
                                       client.heartbeat_s, record_sync)
                if result.status != "skipped":
                    tokens, losses = 0, []
                record_sync(result)
            if bar:
                bar.update(trainer.step, loss=f"{record['loss']:.4f}", version=client.version)
            every = trainer.config.checkpoint_every
            if every and trainer.step % every == 0:
                trainer.save_checkpoint()
        trainer.save_checkpoint()
        if pacer.overruns:
            say(f"emulated pacing overran on {pacer.overruns} of {pacer.steps} steps (compute up to "
                f"{pacer.worst_compute_s:.3f} s > {options.pace_step_s:.3f} s): the host was too busy to emulate "
                f"this speed; step times {pacer.trust().describe()}")
        say(f"stopped at step {trainer.step}, version {client.version}" +
            (" (the run's token budget is spent)" if client.finished else ""))
    finally:
        client.close()
    return records
