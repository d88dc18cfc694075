"""The outer-loop simulator at the paper's scale: placement, and the overhead it reports."""

import os

import pytest

from h2.core.errors import UserError
from h2.ps.simulator import Scenario, SiteCluster, load_scenario, placement, simulate

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER = os.path.join(REPO_ROOT, "configs", "dips", "paper-table1.yaml")


def scenario(bandwidth, pflops=(100.0, 100.0, 400.0)):
    return Scenario(parameters=1e9, clusters=[SiteCluster(f"c{i}", p) for i, p in enumerate(pflops)],
                    bandwidth_gbps=bandwidth, inner_steps=10, shards=1)


def test_the_ps_goes_where_bandwidth_weighted_by_throughput_is_largest():
    # site 1 links best to the slow clusters, site 2 to the fast one (4x the throughput)
    bandwidth = [[10, 1, 1], [1, 10, 10], [1, 1, 30]]
    # B_i^T p with p = (1, 1, 4): site 0: 10 + 1 + 4 = 15, site 1: 1 + 10 + 40 = 51, site 2: 1 + 1 + 120 = 122
    assert placement(scenario(bandwidth)) == 2


def test_a_push_of_the_papers_model_moves_400_gigabytes_and_the_overhead_is_a_few_percent():
    config = load_scenario(PAPER)
    sim = simulate(config, rounds=12)
    assert config.model_bytes == 400e9
    a1 = sim.clusters["A1"]
    assert a1.push_s / a1.rounds == pytest.approx(400e9 * 8 / (2 * 8e9))  # two workers at 8 Gbps each
    assert 0.02 < a1.overhead < 0.10


def test_a_bandwidth_matrix_of_the_wrong_shape_is_one_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("parameters: 1.0e+9\nclusters: [{name: a, pflops: 1.0}]\nbandwidth_gbps: [[1, 2]]\n")
    with pytest.raises(UserError, match=r"field 'bandwidth_gbps' must be 1 x 1"):
        load_scenario(str(path))
