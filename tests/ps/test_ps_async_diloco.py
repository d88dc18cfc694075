"""Mode async-diloco (the Di-PS paper's baseline: asynchronous DiLoCo on a decentralized architecture) through
the real master and shards (in-process): each cluster keeps its own copy of the global model and its own outer
optimizer, and a round all-reduces the pseudo-gradients of the clusters that finished their inner phase."""

import json

import pytest
import torch

import ps_harness
from h2.core.dips import OuterOptions, PSOptions
from h2.core.model_config import preset
from h2.core.training import TrainConfig
from h2.ps.client import ClusterClient
from h2.train.ps_sync import run_with_ps
from h2.train.trainer import Trainer
from ps_harness import model_tensors, running_ps

TOKENS = 512
OUTER = OuterOptions()  # nesterov, lr 0.7, momentum 0.8


def rounds_of(out_dir) -> list[dict]:
    events = [json.loads(line) for line in open(out_dir / "rounds.jsonl")]
    return [event for event in events if event["event"] == "round"]


def inner_phase(tensors: dict[str, torch.Tensor], cluster: str, round_id: int) -> None:
    """Stands in for H inner steps: a fixed, seeded change of the cluster's local model."""
    generator = torch.Generator().manual_seed(1000 * sum(map(ord, cluster)) + round_id)
    with torch.no_grad():
        for value in tensors.values():
            value.add_(0.01 * torch.randn(value.shape, generator=generator))


def sync_together(clients: dict[str, ClusterClient], tensors: dict, round_id: int) -> dict:
    """The named clusters finish their inner phase of `round_id` and sync at the same time."""
    for cid in clients:
        inner_phase(tensors[cid], cid, round_id)
    return ps_harness.sync_together(clients, tensors, TOKENS, close=False)


def run_rounds(out_dir, mode: str, rounds: int = 3) -> tuple[dict, list[dict]]:
    """Clusters a and b, both taking part in every round; the tensors each holds at the end."""
    with running_ps(out_dir, clusters=("a", "b"), mode=mode, grace_s=2.0) as (_, _, address):
        clients = {cid: ClusterClient(address, cid, log=lambda _: None) for cid in ("a", "b")}
        tensors = {cid: {name: torch.zeros_like(value) for name, value in model_tensors().items()} for cid in clients}
        for cid, client in clients.items():
            client.start(tensors[cid], fresh=True)
        for round_id in range(1, rounds + 1):
            results = sync_together(clients, tensors, round_id)
            assert {result.status for result in results.values()} == {"applied"}, results
        for client in clients.values():
            client.close()
    return tensors, rounds_of(out_dir)


def test_clusters_that_always_finish_together_train_exactly_like_sync_diloco(tmp_path):
    synced, sync_rounds = run_rounds(tmp_path / "sync", "sync")
    ours, our_rounds = run_rounds(tmp_path / "async-diloco", "async-diloco")
    assert [r["participants"] for r in our_rounds] == [["a", "b"]] * 3 == [r["participants"] for r in sync_rounds]
    for cid in ("a", "b"):
        for name, value in synced[cid].items():
            assert torch.equal(ours[cid][name], value), (cid, name)
    # and it moved: three outer steps away from version 0
    assert not torch.equal(ours["a"]["embed.weight"], model_tensors()["embed.weight"])


def reference_outer_step(model: dict[str, torch.Tensor], optimizer_state: dict, average: dict) -> None:
    """torch.optim.SGD (nesterov) on one cluster's own parameters: the independent reference."""
    for name, value in model.items():
        parameter = optimizer_state.setdefault(name, {"p": torch.nn.Parameter(value.clone())})
        if "opt" not in parameter:
            parameter["opt"] = torch.optim.SGD([parameter["p"]], lr=OUTER.lr, momentum=OUTER.momentum, nesterov=True)
        parameter["p"].grad = average[name].clone()
        parameter["opt"].step()
        model[name] = parameter["p"].detach().clone()


def test_each_cluster_steps_its_own_outer_optimizer_and_a_stale_one_pushes_against_its_own_copy(tmp_path):
    initial = model_tensors()
    with running_ps(tmp_path, clusters=("a", "b"), mode="async-diloco", grace_s=2.0) as (_, _, address):
        clients = {cid: ClusterClient(address, cid, log=lambda _: None) for cid in ("a", "b")}
        tensors = {cid: {name: torch.zeros_like(value) for name, value in initial.items()} for cid in clients}
        for cid, client in clients.items():
            client.start(tensors[cid], fresh=True)
        # round 1: only a finished its inner phase; round 2: a and b (b's pseudo-gradient spans both phases)
        assert sync_together({"a": clients["a"]}, tensors, 1)["a"].status == "applied"
        inner_phase(tensors["b"], "b", 1)
        local_b = {name: value.clone() for name, value in tensors["b"].items()}
        after_a1 = {name: value.clone() for name, value in tensors["a"].items()}
        results = sync_together(clients, tensors, 2)
        assert {result.status for result in results.values()} == {"applied"}
        for client in clients.values():
            client.close()
    rounds = rounds_of(tmp_path)
    assert [r["participants"] for r in rounds] == [["a"], ["a", "b"]]
    assert rounds[1]["staleness"] == {"a": 0, "b": 1}

    # the same arithmetic, independently: one torch.optim.SGD per cluster on the cluster's own copy
    states = {"a": {}, "b": {}}
    global_a, global_b = dict(initial), dict(initial)
    a_local_1 = {name: value.clone() for name, value in initial.items()}
    inner_phase(a_local_1, "a", 1)
    reference_outer_step(global_a, states["a"], {name: initial[name] - a_local_1[name] for name in initial})
    for name in initial:
        torch.testing.assert_close(after_a1[name], global_a[name], rtol=0, atol=1e-6)
    a_local_2 = {name: value.clone() for name, value in global_a.items()}
    inner_phase(a_local_2, "a", 2)
    b_local_2 = {name: value.clone() for name, value in local_b.items()}
    inner_phase(b_local_2, "b", 2)
    average = {
        name: 0.5 * (global_a[name] - a_local_2[name]) + 0.5 * (global_b[name] - b_local_2[name]) for name in initial
    }
    reference_outer_step(global_a, states["a"], average)
    reference_outer_step(global_b, states["b"], average)
    for name in initial:
        torch.testing.assert_close(tensors["a"][name], global_a[name], rtol=0, atol=1e-5)
        torch.testing.assert_close(tensors["b"][name], global_b[name], rtol=0, atol=1e-5)
    # their copies of the global model differ: a's momentum holds round 1, b's does not
    assert not torch.allclose(tensors["a"]["embed.weight"], tensors["b"]["embed.weight"])


def test_a_trainer_cluster_starts_from_the_runs_seed_and_with_outer_sgd_lr1_trains_like_the_single_device_one(tmp_path):
    """The trainer's path (h2 train --ps): version 0 built on the cluster, its own outer step after each round."""
    config = TrainConfig(steps=4, checkpoint_every=0, micro_batch_size=4)
    reference = Trainer(preset("tiny"), config, str(tmp_path / "reference"), show_progress=False).run()
    with running_ps(tmp_path / "ps", clusters=("solo", ), mode="async-diloco", inner_steps=1, eval_sequences=0,
                    grace_s=0.0, outer=OuterOptions(optimizer="sgd", lr=1.0, momentum=0.0)) as (_, _, address):
        trainer = Trainer(preset("tiny"), config, str(tmp_path / "cluster"), show_progress=False)
        with torch.no_grad():
            for param in trainer.model.parameters():
                param.add_(1.0)  # not the run's version 0: the cluster must take it from the seed
        records = run_with_ps(trainer, PSOptions(ps=address, cluster_id="solo"), show_progress=False,
                              log=lambda _: None)
    assert [r["participants"] for r in rounds_of(tmp_path / "ps")] == [["solo"]] * 4
    for ours, theirs in zip(records, reference, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5), ours["step"]
