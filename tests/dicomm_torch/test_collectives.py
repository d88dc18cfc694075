"""Every collective of the dicomm backend over 4 local processes, against closed forms."""
import pytest

from torch_jobs import assert_passed_on_every_rank, run_job

CHECKS = [
    "barrier_waits_for_the_last_rank",
    "all_reduce_every_op_and_dtype_matches_closed_form",
    "all_reduce_large_uneven_buffer_matches_closed_form",
    "all_reduce_of_non_contiguous_tensor_writes_back_in_place",
    "all_reduce_of_complex_sums_real_and_imaginary_parts",
    "async_all_reduce_future_yields_the_result",
    "coalesced_all_reduces_complete_as_one_work",
    "broadcast_from_each_root_for_each_dtype",
    "broadcast_into_non_contiguous_tensor",
    "all_gather_list_with_non_contiguous_outputs",
    "all_gather_into_tensor_stacks_ranks_in_order",
    "reduce_scatter_list_and_tensor_match_closed_form",
    "all_to_all_list_and_single_with_uneven_splits",
    "gather_scatter_and_reduce_reach_only_the_root",
    "new_group_with_dicomm_backend_reduces_over_its_members",
    "collective_with_mismatched_sizes_fails_naming_the_op",
]


@pytest.fixture(scope="module")
def ranks():
    return run_job("collectives", world_size=4, timeout=150)


@pytest.mark.slow
@pytest.mark.parametrize("name", CHECKS)
def test_collective(ranks, name):
    assert_passed_on_every_rank(ranks, name)
