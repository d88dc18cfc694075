"""Topology: ranks to stages, TP/DP groups inside a stage, and the resharding plans between stages."""

from __future__ import annotations

from collections import Counter

import pytest

from h2.core.errors import UserError
from h2.core.schedule import schedule_actions
from h2.core.strategy import strategy_from_mapping
from heteropp.data_parallel import assign_owners
from heteropp.topology import Topology, blocks


def topology(tps, dp, layers=None, stage_dps=None, micro_batch_size=1):
    layers = layers or [1] * len(tps)
    stage_dps = stage_dps or [None] * len(tps)
    data = {
        "dp": dp, "micro_batches": 4, "micro_batch_size": micro_batch_size, "model": {
            "preset": "tiny", "num_layers": sum(layers)
        }, "stages": [{"chip": f"chip{i}", "tp": tp, "layers": n, "recompute": i == 0}
                      | ({} if stage_dp is None else {"dp": stage_dp})
                      for i, (tp, n, stage_dp) in enumerate(zip(tps, layers, stage_dps))]
    }
    return Topology.from_strategy(strategy_from_mapping(data, "test"))


def test_paper_figure8_stages_take_consecutive_rank_blocks_of_tp_times_dp():
    topo = topology([2, 4, 2], dp=2, layers=[3, 2, 1])
    assert topo.world_size == 16
    assert [list(s.ranks) for s in topo.stages] == [list(range(0, 4)), list(range(4, 12)), list(range(12, 16))]
    assert [list(s.layers) for s in topo.stages] == [[0, 1, 2], [3, 4], [5]]
    assert [s.recompute for s in topo.stages] == [True, False, False]


def test_per_stage_dp_of_figure8_sizes_each_stage_and_splits_the_micro_batch_over_its_replicas():
    topo = topology([2, 4, 2], dp=4, layers=[8, 6, 4], stage_dps=[None, 2, 2])
    assert [(s.tp, s.dp) for s in topo.stages] == [(2, 4), (4, 2), (2, 2)]
    assert topo.world_size == 8 + 8 + 4
    assert [list(s.ranks) for s in topo.stages] == [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    assert topo.micro_batch_sequences == 4
    assert [s.micro_batch_size for s in topo.stages] == [1, 2, 2]
    assert [list(topo.stages[1].rows(d)) for d in range(2)] == [[0, 1], [2, 3]]
    assert topo.dp_groups()[2:6] == [[8, 12], [9, 13], [10, 14], [11, 15]]


@pytest.mark.parametrize("stage_dp,message", [(3, "cannot split a micro-batch of dp * micro_batch_size = 4"),
                                              (0, "must be positive")])
def test_a_stage_dp_that_cannot_split_the_micro_batch_is_refused_naming_the_stage(stage_dp, message):
    with pytest.raises(UserError, match=r"stages\[1\]\.dp") as error:
        topology([1, 1], dp=4, stage_dps=[None, stage_dp])
    assert message in str(error.value)


def test_tp_neighbours_are_adjacent_ranks_and_dp_groups_stride_by_tp():
    topo = topology([2, 4], dp=2)
    assert topo.tp_groups() == [[0, 1], [2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert topo.dp_groups() == [[0, 2], [1, 3], [4, 8], [5, 9], [6, 10], [7, 11]]
    place = topo.place(9)
    assert (place.stage, place.dp_index, place.tp_index) == (1, 1, 1)


def test_every_rank_is_in_exactly_one_tp_group_and_one_dp_group():
    for topo in (topology([1, 2, 4, 2], dp=3), topology([2, 4, 1], dp=4, stage_dps=[None, 2, 1])):
        for groups in (topo.tp_groups(), topo.dp_groups()):
            assert sorted(r for g in groups for r in g) == list(range(topo.world_size))


def rank_elements(topo, stage_index, row_numel):
    """Elements each rank of a stage holds (its replica's range) and its TP block of that range."""
    stage = topo.stages[stage_index]
    held, block = {}, {}
    for d in range(stage.dp):
        start, stop = stage.replica_elements(d, row_numel)
        for t, part in enumerate(blocks(start, stop, stage.tp)):
            held[stage.rank_of(d, t)] = set(range(start, stop))
            block[stage.rank_of(d, t)] = set(range(*part))
    return held, block


PLAN_SHAPES = [  # (tps, dp, stage dps, micro_batch_size)
    ([1, 1], 2, None, 1),
    ([1, 2], 2, None, 1),
    ([2, 1], 2, None, 1),
    ([4, 2], 2, None, 1),
    ([2, 4], 1, None, 1),
    ([1, 4], 1, None, 1),
    ([4, 1], 2, None, 1),
    ([2, 4], 4, [None, 2], 1),
    ([4, 2], 2, [None, 2], 1),
    ([2, 2], 4, [1, 4], 1),
    ([1, 2], 2, [2, 1], 3),
    ([4, 2], 6, [3, 2], 1),
]


@pytest.mark.parametrize("tps,dp,stage_dps,mbs", PLAN_SHAPES)
@pytest.mark.parametrize("row_numel", [8, 7])
def test_sliced_plan_moves_every_element_once_into_the_receivers_own_block(tps, dp, stage_dps, mbs, row_numel):
    topo = topology(tps, dp, stage_dps=stage_dps, micro_batch_size=mbs)
    total = topo.micro_batch_sequences * row_numel
    for src, dst in ((0, 1), (1, 0)):
        plan = topo.sliced_transfers(src, dst, row_numel)
        sender_held, _ = rank_elements(topo, src, row_numel)
        _, receiver_block = rank_elements(topo, dst, row_numel)
        moved = sorted(e for t in plan for e in range(t.start, t.stop))
        assert moved == list(range(total))  # one copy crosses
        for t in plan:
            assert set(range(t.start, t.stop)) <= sender_held[t.src]
        for receiver, needed in receiver_block.items():
            assert {e for t in plan if t.dst == receiver for e in range(t.start, t.stop)} == needed
        assert len({(t.src, t.dst) for t in plan}) == len(plan)  # one message per pair: tags stay unique


@pytest.mark.parametrize("tps,dp,stage_dps,mbs", PLAN_SHAPES)
def test_full_plan_gives_every_receiver_its_replicas_whole_range(tps, dp, stage_dps, mbs):
    topo = topology(tps, dp, stage_dps=stage_dps, micro_batch_size=mbs)
    row_numel = 5
    for src, dst in ((0, 1), (1, 0)):
        plan = topo.full_transfers(src, dst, row_numel)
        sender_held, _ = rank_elements(topo, src, row_numel)
        receiver_held, _ = rank_elements(topo, dst, row_numel)
        for receiver, needed in receiver_held.items():
            got = sorted(e for t in plan if t.dst == receiver for e in range(t.start, t.stop))
            assert got == sorted(needed)
        assert all(set(range(t.start, t.stop)) <= sender_held[t.src] for t in plan)
        assert len({(t.src, t.dst) for t in plan}) == len(plan)


def test_sliced_plan_balances_senders_when_dp_matches():
    topo = topology([4, 2], dp=2)
    plan = topo.sliced_transfers(0, 1, row_numel=64)
    assert set(Counter(t.src for t in plan).values()) == {1}
    assert {t.numel for t in plan} == {16}


def test_full_plan_sends_from_the_sender_with_the_receivers_tp_index_modulo_the_senders_tp():
    topo = topology([4, 2], dp=1)
    forward = topo.full_transfers(0, 1, row_numel=3)
    assert [(t.src, t.dst, t.start, t.stop) for t in forward] == [(0, 4, 0, 3), (1, 5, 0, 3)]
    backward = topo.full_transfers(1, 0, row_numel=3)
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


def test_the_shipped_figure8_strategy_is_the_papers_shape():
    import os

    from h2.core.strategy import load_strategy
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    topo = Topology.from_strategy(load_strategy(os.path.join(root, "configs", "strategies", "local-fig8-exact.yaml")))
    assert [(s.tp, s.dp, len(s.layers), s.recompute) for s in topo.stages] == [(2, 4, 8, True), (4, 2, 6, False),
                                                                               (2, 2, 4, False)]
    assert topo.world_size == 20 and [s.chip for s in topo.stages] == ["emu-a", "emu-a", "emu-b"]
