"""Running a HeteroPP strategy on local processes (gloo on 127.0.0.1) and the reference trainer on
the same data, for the tests and benchmarks."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import torch
import torch.distributed as dist

from h2.core.ranks import run_ranks
from h2.core.strategy import strategy_from_mapping
from h2.train import TrainConfig, Trainer


def _rank_main(rank: int, world_size: int, strategy_data: dict, steps: int, out_dir: str, options: dict, train: dict,
               start: dict) -> dict:
    from datetime import timedelta

    from h2.core.training import PipelineOptions
    from h2.train.pipeline import PipelineTrainer
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    try:
        strategy = strategy_from_mapping(strategy_data, "test strategy")
        options = dict(options)
        config = TrainConfig(steps=steps, device=options.pop("device", "cpu"), **train)
        trainer = PipelineTrainer(strategy, config, out_dir, PipelineOptions(**options), source="test strategy",
                                  **start)
        records = trainer.run()
        stage_report = trainer.stage_report()
        engine = trainer.engine
        return {
            "chunk_parameter_names": [[engine.optimizer.names[i] for i in chunk]
                                      for chunk in engine.chunk_params], "rank": rank, "stage": engine.place.stage,
            "bytes_sent": engine.p2p.bytes_sent, "optimizer_state_elements": engine.optimizer.owned_state_elements(),
            "reduced_gradient_elements": engine.optimizer.reduced_gradient_elements, "host_copies": getattr(
                engine.executor, "host_copies",
                0), "prefetches": getattr(engine.executor, "prefetches", 0), "parameter_elements": sum(
                    p.numel() for p in engine.optimizer.params), "mean_step_s": sum(r["step_time_s"]
                                                                                    for r in records) / len(records),
            "elapsed_s": trainer.elapsed_s, "stage_report": stage_report, "parameter_devices": sorted({
                str(p.device) for p in engine.optimizer.params
            }), "device_host_accessible": (torch.dipu.get_device_properties(
                engine.device).host_accessible if engine.device.type == "dipu" else None), "parameter_moves_out": list(
                    getattr(engine.executor, "parameter_moves_out", (0, 0))), "routes_sent": [
                        list(dataclasses.astuple(r)) for r in getattr(engine.executor, "sent", [])
                    ], "routes_received": [
                        list(dataclasses.astuple(r)) for r in getattr(engine.executor, "received", [])
                    ], "tp_backend": dist.get_backend(engine.groups.tp) if engine.groups.tp is not None else None,
            "compute_order": " ".join(str(a) for a in engine.actions if a.kind in ("F", "B", "W"))
        }
    finally:
        dist.destroy_process_group()


def world_size_of(strategy_data: dict) -> int:
    return strategy_from_mapping(strategy_data, "test strategy").world_size


def run_pipeline(strategy_data: dict, steps: int, *, out_dir: str | None = None, train: dict | None = None,
                 start: dict | None = None, env: dict | None = None, **options) -> tuple[list[dict], list[dict]]:
    """Train up to step `steps` on local processes; returns (metrics records, per-rank summaries).
    `out_dir`: the run's folder (default: a new one); `train`: more TrainConfig fields; `start`: the
    PipelineTrainer's run-folder keywords (resume, overwrite, explicit); `env`: more environment of the
    ranks (e.g. DIPU_HOST_PROFILE); `options`: PipelineOptions."""
    out_dir = out_dir or tempfile.mkdtemp(prefix="heteropp-test-")
    world_size = world_size_of(strategy_data)
    # forkserver: ranks fork from a clean server process that imported torch once (seconds saved per
    # process on 2 cores), never from this test process, whose autograd threads (after a backward on
    # a device such as dipu) make a plain fork unsafe.
    ranks = run_ranks(_rank_main, world_size, (strategy_data, steps, out_dir, options, train or {}, start or {}),
                      timeout=300, env=env, start_method="forkserver", preload=["torch", "h2.model", "heteropp"])
    with open(os.path.join(out_dir, "metrics.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return records, ranks


def run_reference(strategy_data: dict, steps: int, dtype: str = "fp32", train: dict | None = None) -> list[dict]:
    """The single-device trainer on the same global batches: dp * micro_batches micro-batches a step
    (`train`: more TrainConfig fields, as run_pipeline's)."""
    strategy = strategy_from_mapping(strategy_data, "test strategy")
    model = strategy.model_config()
    config = TrainConfig(steps=steps, dtype=dtype, micro_batch_size=strategy.micro_batch_size,
                         micro_batches=strategy.micro_batches * strategy.dp, seq_len=strategy.seq_len
                         or model.max_seq_len, **(train or {}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and the machine is shared
    try:
        return Trainer(model, config, tempfile.mkdtemp(prefix="heteropp-ref-"), show_progress=False).run()
    finally:
        torch.set_num_threads(threads)


def max_relative_loss_difference(records: list[dict], reference: list[dict]) -> float:
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    return max(abs(r["loss"] - q["loss"]) / abs(q["loss"]) for r, q in zip(records, reference))
