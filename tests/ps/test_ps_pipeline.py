"""A HeteroPP pipeline as a Di-PS cluster: its ranks push and pull their own stages' layers."""

from __future__ import annotations

import pytest

from h2.core.dips import OuterOptions, PSOptions
from h2.core.model_config import preset
from h2.core.ranks import RankFailure, run_ranks
from h2.core.training import TrainConfig
from h2.model.transformer import Transformer
from h2.train.ps_sync import run_with_ps
from h2.train.trainer import Trainer
from heteropp.stage import apply_recompute, build_stage
from heteropp.stage_parameters import stage_parameters
from heteropp.tensor_parallel import apply_tp
from ps_harness import running_ps
from ps_pipeline_ranks import pipeline_cluster_rank

STEPS = 4
STRATEGY = {
    "dp": 1, "micro_batches": 4, "micro_batch_size": 2, "seq_len": 32, "schedule": "1f1b", "model": "tiny", "stages": [{
        "chip": "emu-big", "tp": 2, "layers": 2, "recompute": True
    }, {"chip": "emu-small", "tp": 1, "layers": 2, "recompute": False}]
}


def test_a_stage_names_every_parameter_after_the_full_model():
    model = Transformer(preset("tiny"))
    stage = apply_recompute(
        apply_tp(build_stage(model, range(2, 4), first=False, last=True), tp_index=0, tp_size=1, group=None,
                 store=None))
    names = [name for name, _, _ in stage_parameters(stage, range(2, 4))]
    assert sorted(names) == sorted(n for n in dict(model.named_parameters())
                                   if not n.startswith(("embed", "layers.0", "layers.1")))
    tp2 = apply_tp(build_stage(Transformer(preset("tiny")), range(2, 4), first=False, last=True), tp_index=0, tp_size=2,
                   group=None, store=None)
    dim = {name: dim for name, _, dim in stage_parameters(tp2, range(2, 4))}
    assert (dim["layers.2.attn.o_proj.weight"], dim["head.weight"], dim["norm.weight"]) == (1, 0, None)


def single_device_cluster_losses(tmp_path, outer: OuterOptions) -> list[float]:
    config = TrainConfig(steps=STEPS, checkpoint_every=0, micro_batch_size=2, micro_batches=4, seq_len=32)
    with running_ps(tmp_path / "single-ps", clusters=("solo", ), mode="sync", inner_steps=1, eval_sequences=0,
                    outer=outer) as (_, _, address):
        trainer = Trainer(preset("tiny"), config, str(tmp_path / "single"), show_progress=False)
        return [
            r["loss"] for r in run_with_ps(trainer, PSOptions(ps=address, cluster_id="solo"), show_progress=False,
                                           log=lambda _: None)
        ]


@pytest.mark.slow
def test_a_tp2_pipeline_cluster_follows_the_outer_steps_exactly_like_a_single_device_cluster(tmp_path):
    outer = OuterOptions(optimizer="sgd", lr=0.5, momentum=0.0)  # the pulled model is not the pushed one
    expected = single_device_cluster_losses(tmp_path, outer)
    with running_ps(tmp_path / "ps", clusters=("pipe", ), mode="sync", inner_steps=1, eval_sequences=0,
                    outer=outer) as (_, _, address):
        ranks = run_ranks(pipeline_cluster_rank, 3, (STRATEGY, STEPS, address, str(tmp_path / "pipe")), timeout=300,
                          start_method="forkserver", preload=["torch", "h2.model", "heteropp"])
    losses = next(result for result in ranks if result is not None)
    assert len(losses) == STEPS
    assert max(abs(ours - theirs) / theirs for ours, theirs in zip(losses, expected)) < 1e-5


@pytest.mark.slow
def test_a_pipeline_cluster_that_joins_an_async_diloco_run_is_refused_in_one_line(tmp_path):
    with running_ps(tmp_path / "ps", clusters=("pipe", ), mode="async-diloco", inner_steps=1,
                    eval_sequences=0) as (_, _, address):
        with pytest.raises(RankFailure, match="mode async-diloco runs single-device clusters only, not --strategy"):
            run_ranks(pipeline_cluster_rank, 3, (STRATEGY, STEPS, address, str(tmp_path / "pipe")), timeout=300,
                      start_method="forkserver", preload=["torch", "h2.model", "heteropp"])
