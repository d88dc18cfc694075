"""Rounds through the real master and shards (in-process): the reduction to the single-device trainer,
and the penalty rejecting a NaN push while the other cluster's update proceeds."""

import json
import math

import pytest
import torch

from h2.core.dips import OuterOptions, PSOptions
from h2.core.model_config import preset
from h2.core.training import TrainConfig
from h2.ps.client import ClusterClient, Outliers
from h2.train.ps_sync import run_with_ps
from h2.train.trainer import Trainer
from ps_harness import model_tensors, running_ps, sync_together

STEPS = 6


def test_one_cluster_with_h1_and_outer_sgd_lr1_trains_exactly_like_the_single_device_trainer(tmp_path):
    config = TrainConfig(steps=STEPS, checkpoint_every=0, micro_batch_size=4)
    reference = Trainer(preset("tiny"), config, str(tmp_path / "reference"), show_progress=False).run()
    with running_ps(tmp_path / "ps", clusters=("solo", ), shards=2, mode="sync", inner_steps=1, eval_sequences=0,
                    outer=OuterOptions(optimizer="sgd", lr=1.0, momentum=0.0)) as (_, _, address):
        trainer = Trainer(preset("tiny"), config, str(tmp_path / "cluster"), show_progress=False)
        records = run_with_ps(trainer, PSOptions(ps=address, cluster_id="solo"), show_progress=False,
                              log=lambda _: None)
    assert len(records) == STEPS
    for ours, theirs in zip(records, reference):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5), ours["step"]


def test_after_an_outer_sgd_step_of_lr_half_the_cluster_holds_the_midpoint_of_global_and_local(tmp_path):
    config = TrainConfig(steps=1, checkpoint_every=0, micro_batch_size=4)
    initial = model_tensors()
    reference = Trainer(preset("tiny"), config, str(tmp_path / "reference"), show_progress=False)
    reference.run()
    with running_ps(tmp_path / "ps", clusters=("solo", ), mode="sync", inner_steps=1, eval_sequences=0,
                    outer=OuterOptions(optimizer="sgd", lr=0.5, momentum=0.0)) as (_, _, address):
        trainer = Trainer(preset("tiny"), config, str(tmp_path / "cluster"), show_progress=False)
        run_with_ps(trainer, PSOptions(ps=address, cluster_id="solo"), show_progress=False, log=lambda _: None)
    trained = dict(reference.model.named_parameters())
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param.detach(), (initial[name] + trained[name].detach()) / 2, rtol=0, atol=1e-6)


def run_round_with_a_nan_push(tmp_path, tokens: int = 512) -> tuple[list[dict], dict, dict]:
    """One dips round of clusters "good" and "bad" (which pushes NaN); the round records, the sync
    results and the tensors each cluster holds afterwards."""
    with running_ps(tmp_path, clusters=("good", "bad"), mode="dips", grace_s=5.0) as (_, _, address):
        clients = {
            cid: ClusterClient(address, cid, log=lambda _: None, outliers=Outliers("nan" if cid == "bad" else "none"))
            for cid in ("good", "bad")
        }
        tensors = {cid: model_tensors() for cid in clients}
        for value in tensors["good"].values():
            value -= 0.001
        results = sync_together(clients, tensors, tokens)
    events = [json.loads(line) for line in open(tmp_path / "rounds.jsonl")]
    return [event for event in events if event["event"] == "round"], results, tensors


def test_a_nan_push_is_rejected_and_logged_while_the_other_clusters_update_proceeds(tmp_path):
    rounds, results, tensors = run_round_with_a_nan_push(tmp_path)
    assert (rounds[0]["accepted"], rounds[0]["rejected"]["bad"]["reason"]) == (["good"], "norm is nan")
    assert (results["good"].status, results["bad"].status) == ("applied", "rejected")
    assert results["good"].version == 1
    assert all(torch.isfinite(value).all() for value in tensors["bad"].values())  # it pulled the new version
    assert math.isfinite(rounds[0]["update_norm"])


def test_only_accepted_pushes_count_their_tokens_toward_the_budget(tmp_path):
    rounds, _, _ = run_round_with_a_nan_push(tmp_path, tokens=512)
    assert rounds[0]["tokens"] == 512
