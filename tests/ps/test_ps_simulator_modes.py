"""The simulator closes rounds as the run file's modes do (h2.core.dips.MODE_RULES), and in async-diloco
the clusters of a round all-reduce among themselves instead of pushing to a PS."""

import pytest

from h2.core.errors import UserError
from h2.ps.simulator import Scenario, SiteCluster, report, simulate


def scenario(pflops=(100.0, 100.0, 200.0)) -> Scenario:
    n = len(pflops)
    return Scenario(parameters=1e9, clusters=[SiteCluster(f"c{i}", p) for i, p in enumerate(pflops)],
                    bandwidth_gbps=[[25.0 if i == j else 8.0 - i - j for j in range(n)]
                                    for i in range(n)], inner_steps=10, shards=2, grace_s=1.0)


def test_sync_rounds_wait_for_every_cluster_and_async_rounds_take_one_arrival():
    assert {len(r.participants) for r in simulate(scenario(), rounds=6, mode="sync").rounds} == {3}
    assert {len(r.participants) for r in simulate(scenario(), rounds=6, mode="async").rounds} == {1}


def test_async_diloco_all_reduces_among_the_rounds_clusters_over_their_slowest_link_with_no_ps_update():
    sim = simulate(scenario(), rounds=8, mode="async-diloco")
    bytes_bits = 1e9 * 4 * 8
    for r in sim.rounds:
        assert r.update_s == 0.0 and set(r.pull_s.values()) == {0.0}
        n = len(r.participants)
        indices = [int(name[1:]) for name in r.participants]
        ring = list(zip(indices, indices[1:] + indices[:1]))
        slowest = min(8.0 - i - j for i, j in ring) if n > 1 else None
        expected = 0.0 if n == 1 else 2 * (n - 1) / n * bytes_bits / (slowest * 1e9)
        assert all(value == pytest.approx(expected) for value in r.push_s.values())
    # c0 and c1 are equally fast: they finish together and all-reduce in one round; c2, twice as fast, alone
    assert ["c0", "c1"] in [sorted(r.participants) for r in sim.rounds] and ["c2"] == sim.rounds[0].participants
    assert "no PS" in report(scenario(), sim)


def test_an_unknown_mode_is_one_line():
    with pytest.raises(UserError, match="mode must be one of sync, async, dips, async-diloco, got 'fast'"):
        simulate(scenario(), mode="fast")
