"""The simulator's weak scaling (clusters added in descending speed, percent of independent clusters' rate)
and the update rate it takes from a run's measured rounds instead of a tuned constant."""

import json

import pytest

from h2.core.errors import UserError
from h2.ps.simulator import Scenario, SiteCluster, measured_update, weak_scaling, with_update_rate


def scenario(update_gbps: float = 2.0) -> Scenario:
    pflops = (100.0, 400.0, 200.0)
    return Scenario(parameters=1e9, clusters=[SiteCluster(f"c{i}", p) for i, p in enumerate(pflops)],
                    bandwidth_gbps=[[25.0 if i == j else 8.0 for j in range(3)]
                                    for i in range(3)], inner_steps=10, shards=2, update_gbps=update_gbps)


def test_clusters_are_added_fastest_first_and_each_set_is_a_percent_of_its_independent_rate():
    points = weak_scaling(scenario(), up_to=3)
    assert [p.clusters for p in points] == [["c1"], ["c1", "c2"], ["c1", "c2", "c0"]]
    assert points[0].ideal_tokens_per_s == pytest.approx(4_194_304 / scenario().step_s(scenario().clusters[1]))
    assert all(0 < p.percent_of_ideal < 100 for p in points)
    slower = weak_scaling(scenario(update_gbps=0.2), up_to=3)  # a slower update costs a larger share
    assert all(s.percent_of_ideal < p.percent_of_ideal for s, p in zip(slower, points))


def test_the_update_rate_comes_from_a_runs_measured_rounds(tmp_path):
    events = [{"event": "start", "shards": 2}
              ] + [{"event": "round", "update_s": s, "bytes_pushed": 2 * 1_000_000, "participants": ["a", "b"]}
                   for s in (0.01, 0.02, 0.5)]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    measured = measured_update(str(tmp_path))
    assert (measured.median_update_s, measured.model_bytes, measured.shards) == (0.02, 1_000_000, 2)
    assert measured.gbps_per_shard == pytest.approx(1_000_000 * 8 / (2 * 0.02 * 1e9))
    assert with_update_rate(scenario(), measured.gbps_per_shard).update_gbps == measured.gbps_per_shard


def test_a_folder_without_rounds_is_one_line():
    with pytest.raises(UserError, match="--update-from /nowhere: no rounds.jsonl"):
        measured_update("/nowhere")
