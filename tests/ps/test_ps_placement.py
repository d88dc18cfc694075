"""The shards' placement at launch (argmax B_iᵀ p over the run file's sites), decided by the same function
as the simulator's."""

import pytest

from h2.cli.ps import _shard_host
from h2.core.dips import ClusterSpec, DipsConfig, SiteSpec, check_dips_config
from h2.core.errors import UserError
from h2.ps import placement
from h2.ps.simulator import Scenario, SiteCluster
from h2.ps.simulator import placement as simulated_placement


def run_file(throughputs=(1.0, 1.0, 4.0)) -> DipsConfig:
    clusters = [ClusterSpec(id=f"c{i}", throughput=p) for i, p in enumerate(throughputs)]
    sites = [
        SiteSpec("near-c0", "127.0.0.1", [10.0, 1.0, 1.0]),
        SiteSpec("near-c1", "127.0.0.2", [1.0, 10.0, 1.0]),
        SiteSpec("near-c2", "127.0.0.3", [1.0, 1.0, 5.0]),
    ]
    return check_dips_config(DipsConfig(clusters=clusters, sites=sites), "run.yaml")


def test_the_launcher_places_the_shards_at_the_site_of_largest_bandwidth_times_throughput():
    said = []
    assert _shard_host(run_file(), said.append) == "127.0.0.3"  # 1 + 1 + 20 against 10 + 1 + 4
    assert "near-c2 (127.0.0.3)" in said[0] and "near-c0 15, near-c1 15, near-c2 22" in said[0]
    assert _shard_host(run_file((1.0, 3.0, 1.0)), said.append) == "127.0.0.2"  # 1 + 30 + 1


def test_a_run_file_without_sites_keeps_the_shards_on_its_host():
    assert _shard_host(DipsConfig(host="10.0.0.7"), print) == "10.0.0.7"


def test_without_throughputs_the_emulated_speeds_weigh_the_clusters():
    config = run_file((0.0, 0.0, 0.0))
    config.clusters[1].step_time_s = 0.1  # 10 steps/s against 1
    assert placement.shard_site(config)[0] == 1


def test_the_simulator_and_the_launcher_decide_placement_in_the_same_function(monkeypatch):
    calls = []
    monkeypatch.setattr("h2.ps.simulator.best_site", lambda b, p: calls.append((b, p)) or 2)
    scenario = Scenario(parameters=1e9, clusters=[SiteCluster(f"c{i}", 100.0) for i in range(3)],
                        bandwidth_gbps=[[1.0] * 3] * 3, inner_steps=10, shards=1)
    assert simulated_placement(scenario) == 2 and calls[0][0] == [[1.0] * 3] * 3
    assert placement.best_site([[1.0, 1.0], [2.0, 0.0]], [1.0, 3.0]) == 0  # 4 against 2


def test_a_site_without_one_bandwidth_per_cluster_is_one_line_naming_the_field():
    config = DipsConfig(clusters=[ClusterSpec(id="a")], sites=[SiteSpec("x", "127.0.0.1", [1.0, 2.0])])
    with pytest.raises(UserError, match=r"run.yaml: field 'sites\[0\].bandwidth_gbps' must give one bandwidth"):
        check_dips_config(config, "run.yaml")
