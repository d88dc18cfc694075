"""One rank of a HeteroPP pipeline that is a cluster of a Di-PS run (started by h2.core.ranks)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def pipeline_cluster_rank(rank: int, world_size: int, strategy_data: dict, steps: int, address: str,
                          out_dir: str) -> list[float] | None:
    from h2.core.dips import PSOptions
    from h2.core.strategy import strategy_from_mapping
    from h2.core.training import TrainConfig
    from h2.train.pipeline import PipelineTrainer
    from h2.train.ps_pipeline import run_pipeline_with_ps

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    try:
        strategy = strategy_from_mapping(strategy_data, "test strategy")
        trainer = PipelineTrainer(strategy, TrainConfig(steps=steps, checkpoint_every=0), out_dir)
        records = run_pipeline_with_ps(trainer, PSOptions(ps=address, cluster_id="pipe"), log=lambda _: None)
        return [record["loss"] for record in records] if trainer.engine.reports_loss else None
    finally:
        dist.destroy_process_group()
