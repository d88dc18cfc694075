"""ZeRO-2 as a reduce-scatter into owned gradient shards and an all-gather of the updated parameters:
each replica keeps the gradient and AdamW state of its own element range of every parameter only,
and the group trains as the single-device reference trainer does (fp32, same data)."""

from __future__ import annotations

import pytest

from h2.core.strategy import strategy_from_mapping
from heteropp.data_parallel import shard_range
from heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

STEPS = 8
TOLERANCE = 1e-5


def group(dp: int, *, ministages: int = 1) -> dict:
    """One stage of `dp` replicas of the tiny model (2 layers), one sequence each per micro-batch."""
    return {
        "dp": dp, "micro_batches": 2, "micro_batch_size": 1, "seq_len": 16, "ministages": ministages,
        "optimizer_sharding": "zero2", "model": {"preset": "tiny", "num_layers": 2}, "stages": [{
            "chips": ["chip-a"] * dp, "tp": 1, "layers": 2
        }]
    }


def parameter_sizes(data: dict) -> list[int]:
    from h2.model import Transformer
    model = Transformer(strategy_from_mapping(data, "test strategy").model_config())
    return [p.numel() for p in model.parameters()]


@pytest.mark.parametrize("numel,dp", [(1, 2), (7, 2), (10, 4), (1024, 4), (3, 4)])
def test_each_replica_owns_one_of_dp_disjoint_element_ranges_that_cover_the_parameter(numel, dp):
    ranges = [shard_range(numel, dp, rank) for rank in range(dp)]
    assert [i for r in ranges for i in r] == list(range(numel))
    assert all(len(r) <= -(-numel // dp) for r in ranges)


def check_group(dp: int, ministages: int = 1) -> None:
    data = group(dp, ministages=ministages)
    records, ranks = run_pipeline(data, STEPS)
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE
    sizes = parameter_sizes(data)
    owned = [sum(len(shard_range(n, dp, r["rank"])) for n in sizes) for r in ranks]
    assert [r["reduced_gradient_elements"] for r in ranks] == owned
    assert [r["optimizer_state_elements"] for r in ranks] == owned
    assert sum(owned) == sum(sizes) == ranks[0]["parameter_elements"]


@pytest.mark.slow
def test_zero2_over_two_replicas_keeps_half_of_every_gradient_and_matches_the_reference():
    check_group(2)


@pytest.mark.slow
def test_zero2_over_four_replicas_keeps_a_quarter_of_every_gradient_and_matches_the_reference():
    check_group(4)


@pytest.mark.slow
def test_zero2_over_two_replicas_with_a_step_per_ministage_matches_the_reference():
    check_group(2, ministages=2)
