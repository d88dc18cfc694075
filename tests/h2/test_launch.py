"""Where `h2 train --strategy --cluster` starts its ranks (h2.cli.launch)."""

import pytest

from h2.cli import launch
from h2.core.cluster import load_cluster
from h2.core.strategy import strategy_from_mapping

CLUSTER = ("chips:\n"
           "  - {name: A, count: 2, memory_gb: 1, chips_per_node: 1, tp_max: 1, intra_node_gbps: 10, inter_node_gbps: 1}\n")
STRATEGY = {"dp": 1, "micro_batches": 2, "micro_batch_size": 1, "model": "tiny",
            "stages": [{"chip": "A", "tp": 1, "layers": 2}, {"chip": "A", "tp": 1, "layers": 2}]}


@pytest.fixture
def started(monkeypatch):
    commands = []
    monkeypatch.setattr(launch.subprocess, "call", lambda command: commands.append(command) or 0)
    monkeypatch.setattr(launch, "run_until_ranks_exit", lambda command, *args: commands.append(command) or 0)
    return commands


def test_without_root_several_nodes_run_on_loopback_and_one_line_says_why(tmp_path, monkeypatch, capsys, started):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    monkeypatch.setattr(launch.netns, "missing_requirements", lambda: ["not root (uid 1000)"])
    status = launch.launch(strategy_from_mapping(STRATEGY, "s.yaml"), load_cluster(tmp_path / "c.yaml"), "job.yaml", "s.yaml")
    assert status == 0 and "--standalone" in started[0]
    assert capsys.readouterr().out == ("h2: 2 emulated nodes on loopback, not network namespaces (not root (uid 1000)): "
                                       "links paced by the pacing layers only\n")


def test_one_node_runs_one_standalone_torchrun_without_namespaces(tmp_path, capsys, started):
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("chips_per_node: 1", "chips_per_node: 2"))
    launch.launch(strategy_from_mapping(STRATEGY, "s.yaml"), load_cluster(tmp_path / "c.yaml"), "job.yaml", "s.yaml")
    assert "--standalone" in started[0] and capsys.readouterr().out == ""
