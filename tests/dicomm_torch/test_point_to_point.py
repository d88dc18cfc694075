"""send/recv, isend/irecv and batch_isend_irecv through the dicomm backend (2 local processes), plus the
object collectives built on it."""
import pytest

from torch_jobs import assert_passed_on_every_rank, run_job

CHECKS = [
    "send_recv_every_dtype",
    "send_recv_non_contiguous_tensors",
    "tags_select_messages_regardless_of_posting_order",
    "pipeline_exchange_in_opposite_orders_unbatched_16",
    "pipeline_exchange_in_opposite_orders_unbatched_1048576",
    "pipeline_exchange_in_opposite_orders_batched_16",
    "pipeline_exchange_in_opposite_orders_batched_1048576",
    "batch_of_many_sends_and_receives_in_rank_specific_order",
    "irecv_future_yields_the_received_tensor",
    "wait_with_timeout_raises_then_a_later_wait_succeeds",
    "size_mismatch_fails_naming_peer_and_op",
    "object_collectives_carry_python_objects",
    "local_peer_uses_shm",
]


@pytest.fixture(scope="module")
def ranks():
    return run_job("p2p", world_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", CHECKS)
def test_point_to_point(ranks, name):
    assert_passed_on_every_rank(ranks, name)
