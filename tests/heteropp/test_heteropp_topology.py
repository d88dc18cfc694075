"""Topology: ranks to stages, TP/DP groups inside a stage, and the resharding plans between stages."""

from __future__ import annotations

from collections import Counter

import pytest

from heteropp.auto.strategy import strategy_from_mapping
from heteropp.data_parallel import assign_owners
from heteropp.schedule import schedule_actions
from heteropp.topology import Topology


def topology(tps, dp, layers=None):
    layers = layers or [1] * len(tps)
    data = {"dp": dp, "micro_batches": 4, "micro_batch_size": 1, "model": {"preset": "tiny", "num_layers": sum(layers)},
            "stages": [{"chip": f"chip{i}", "tp": tp, "layers": n, "recompute": i == 0}
                       for i, (tp, n) in enumerate(zip(tps, layers))]}
    return Topology.from_strategy(strategy_from_mapping(data, "test"))


def test_paper_figure8_stages_take_consecutive_rank_blocks_of_tp_times_dp():
    topo = topology([2, 4, 2], dp=2, layers=[3, 2, 1])
    assert topo.world_size == 16
    assert [list(s.ranks) for s in topo.stages] == [list(range(0, 4)), list(range(4, 12)), list(range(12, 16))]
    assert [list(s.layers) for s in topo.stages] == [[0, 1, 2], [3, 4], [5]]
    assert [s.recompute for s in topo.stages] == [True, False, False]


def test_tp_neighbours_are_adjacent_ranks_and_dp_groups_stride_by_tp():
    topo = topology([2, 4], dp=2)
    assert topo.tp_groups() == [[0, 1], [2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert topo.dp_groups() == [[0, 2], [1, 3], [4, 8], [5, 9], [6, 10], [7, 11]]
    place = topo.place(9)
    assert (place.stage, place.dp_index, place.tp_index) == (1, 1, 1)


def test_every_rank_is_in_exactly_one_tp_group_and_one_dp_group():
    topo = topology([1, 2, 4, 2], dp=3)
    for groups in (topo.tp_groups(), topo.dp_groups()):
        assert sorted(r for g in groups for r in g) == list(range(topo.world_size))


@pytest.mark.parametrize("a,b", [(1, 1), (1, 2), (2, 1), (4, 2), (2, 4), (1, 4), (4, 1)])
def test_sliced_plan_sends_each_slice_once_with_balanced_senders_and_receivers(a, b):
    topo = topology([a, b], dp=2)
    for d in range(2):
        plan = topo.sliced_transfers(0, 1, d)
        n = max(a, b)
        assert sorted(t.slice_index for t in plan) == list(range(n))
        assert set(Counter(t.src for t in plan).values()) == {n // a}
        assert set(Counter(t.dst for t in plan).values()) == {n // b}
        assert {t.src for t in plan} == set(topo.stages[0].tp_group(d))
        assert {t.dst for t in plan} == set(topo.stages[1].tp_group(d))
        for j, receiver in enumerate(topo.stages[1].tp_group(d)):  # a contiguous block each: gathers in place
            block = [t.slice_index for t in plan if t.dst == receiver]
            assert block == list(range(j * n // b, (j + 1) * n // b))


def test_full_plan_gives_every_receiver_the_whole_tensor():
    topo = topology([4, 2], dp=1)
    forward = topo.full_transfers(0, 1, 0)
    assert [(t.src, t.dst, t.num_slices) for t in forward] == [(0, 4, 1), (1, 5, 1)]
    backward = topo.full_transfers(1, 0, 0)
    assert [(t.src, t.dst) for t in backward] == [(4, 0), (5, 1), (4, 2), (5, 3)]


@pytest.mark.parametrize("dp", [2, 3, 4])
def test_zero1_owners_cover_every_replica_and_loads_differ_by_at_most_one_parameter(dp):
    sizes = [4096, 64, 11264, 4096, 2048, 2048, 64, 11264, 11264, 16384, 64]
    owners = assign_owners(sizes, dp)
    loads = [sum(s for s, o in zip(sizes, owners) if o == r) for r in range(dp)]
    assert sum(loads) == sum(sizes) and min(loads) > 0
    assert max(loads) - min(loads) <= max(sizes)


def test_every_send_in_the_action_lists_has_a_matching_receive_on_the_neighbour():
    for name in ("1f1b", "1f1b-split-backward"):
        lists = schedule_actions(name, 3, 5)
        for stage in range(2):
            sent = [a.micro_batch for a in lists[stage] if a.kind == "SEND_F"]
            received = [a.micro_batch for a in lists[stage + 1] if a.kind == "RECV_F"]
            assert sent == received == list(range(5))
            sent_back = [a.micro_batch for a in lists[stage + 1] if a.kind == "SEND_B"]
            received_back = [a.micro_batch for a in lists[stage] if a.kind == "RECV_B"]
            assert sent_back == received_back == list(range(5))
