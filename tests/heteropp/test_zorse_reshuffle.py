"""Zorse's dynamic micro-batch reshuffling (heteropp.reshuffle): the plan, the refusals, and a pipeline of
two uneven groups on emulated chips of different speeds, trained against the single-device reference
trainer (fp32, same data) with every micro-batch routed by the order its stage finished it."""

from __future__ import annotations

import os

import pytest
import yaml

from h2.core.errors import UserError
from h2.core.strategy import strategy_from_mapping
from heteropp.reshuffle import check_reshuffle, finish_order_destinations, replica_quotas
from heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

STEPS = 6
TOLERANCE = 1e-5


def test_quotas_follow_the_rows_by_the_largest_remainder():
    assert replica_quotas([1, 3], 4) == [1, 3]
    assert replica_quotas([2, 2], 4) == [2, 2]
    assert replica_quotas([1, 3], 6) == [1, 5]  # 1.5 and 4.5: the larger share takes the tie
    assert replica_quotas([1, 1, 2], 3) == [1, 1, 1]  # remainders 0.75, 0.75, 0.5
    assert sum(replica_quotas([3, 5, 7], 11)) == 11


def test_the_ith_finished_micro_batch_goes_to_the_replica_with_the_ith_most_work_left():
    # rows 1:3 of 4 micro-batches: the slow replica's one micro-batch costs as much as the fast one's
    # three, so it takes the first finished (the slower chip wins the tie), the fast one the rest
    assert finish_order_destinations([1, 3], 4) == [0, 1, 1, 1]
    # 8 micro-batches, quotas 2 and 6 (work 2 and 2): slow, fast, then the fast one's 5 against the
    # slow one's 1 until they meet again
    assert finish_order_destinations([1, 3], 8) == [0, 1, 1, 1, 0, 1, 1, 1]
    assert finish_order_destinations([2, 2], 4) == [0, 1, 0, 1]
    assert finish_order_destinations([4], 3) == [0, 0, 0]


def strategy_data(**overrides) -> dict:
    """Stage 0: two replicas taking two micro-batches each; stage 1: a slow replica (rows 1) and a
    fast one (rows 3) taking one and three of the 4 micro-batches. The tiny model's 4 layers, 2 each."""
    data = {
        "dp": 2, "micro_batches": 4, "micro_batch_size": 2, "seq_len": 32, "schedule": "gpipe", "reshuffle": True,
        "model": {"preset": "tiny", "num_layers": 4}, "stages": [{
            "chips": ["chip-a", "chip-b"], "rows": [2, 2], "tp": 1, "layers": 2
        }, {"chips": ["chip-a", "chip-b"], "rows": [1, 3], "tp": 1, "layers": 2}]
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize("change, message", [
    ({"schedule": "1f1b"}, "set schedule: gpipe"),
    ({"ministages": 2}, "without ministages or offload"),
    ({"offload": ["activations"]}, "without ministages or offload"),
    ({"optimizer_sharding": "zero2"}, "none or zero1"),
])
def test_reshuffle_is_refused_in_one_line_where_it_does_not_run(change, message):
    strategy = strategy_from_mapping(strategy_data(**change), "s.yaml")
    schedule = "gpipe" if strategy.ministages > 1 or strategy.offload else strategy.schedule
    with pytest.raises(UserError, match=message) as error:
        check_reshuffle(strategy, strategy.optimizer_sharding or "none", schedule, "s.yaml")
    assert str(error.value).startswith("s.yaml: field 'reshuffle'") and "\n" not in str(error.value)


def chip_profiles(directory) -> dict[int, str]:
    """Rank 0 (stage 0's first replica) an emulated chip 20x slower than the others."""
    paths = {}
    for name, speed in (("slow", 0.05), ("fast", 1.0)):
        path = os.path.join(directory, f"{name}.yaml")
        with open(path, "w") as handle:
            yaml.safe_dump({"name": name, "device_count": 1, "memory_capacity": "2GiB", "relative_speed": speed},
                           handle)
        paths[name] = path
    return paths


@pytest.mark.slow
def test_reshuffled_uneven_groups_on_chips_of_different_speeds_match_the_reference(tmp_path):
    """Stage 0's slow replica finishes its first micro-batch (0) after the fast one's (1): the first
    finished is micro-batch 1, and it goes to stage 1's slow replica (the most work left), where the
    static map would send micro-batch 0. Every route follows the finish order; losses equal the
    single-device trainer's."""
    profiles = chip_profiles(str(tmp_path))
    data = strategy_data()
    records, ranks = run_pipeline(data, STEPS, device="dipu",
                                  env=lambda rank: {"DIPU_HOST_PROFILE": profiles["slow" if rank == 0 else "fast"]})
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE
    plan = finish_order_destinations([1, 3], 4)
    stage_1_ranks = [2, 3]
    sent = [route for rank in ranks if rank["stage"] == 0 for route in rank["routes_sent"]]
    assert sorted(route[0] for route in sent) == [0, 1, 2, 3]
    assert sorted(route[1] for route in sent) == [0, 1, 2, 3]
    finish_index = {micro_batch: index for micro_batch, index, _, _ in sent}
    assert finish_index[1] < finish_index[0]  # the slow chip's micro-batch finished later
    assert all(dst == stage_1_ranks[plan[index]] for _, index, _, dst in sent)
    for rank in ranks:
        if rank["stage"] == 1:
            order = [index for _, index, _, _ in rank["routes_received"]]
            assert order == sorted(order) and order  # each receiver ran its micro-batches in finish order


@pytest.mark.slow
def test_three_stages_reshuffled_at_both_boundaries_match_the_reference():
    """dp 2 (rows 1:3) -> dp 1 -> dp 2 (rows 2:2), on the CPU: every boundary routes by finish order."""
    data = strategy_data(stages=[{"chips": ["chip-a", "chip-b"], "rows": [1, 3], "tp": 1, "layers": 1}, {
        "chip": "chip-b", "dp": 1, "tp": 1, "layers": 2
    }, {"chips": ["chip-a", "chip-b"], "rows": [2, 2], "tp": 1, "layers": 1}])
    records, ranks = run_pipeline(data, 4)
    assert max_relative_loss_difference(records, run_reference(data, 4)) < TOLERANCE
    middle = [rank for rank in ranks if rank["stage"] == 1]
    assert [index for _, index, _, _ in middle[0]["routes_received"]] == [0, 1, 2, 3]
    plan = finish_order_destinations([2, 2], 4)
    assert all(dst == 3 + plan[index] for _, index, _, dst in middle[0]["routes_sent"])
