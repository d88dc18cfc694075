"""dipu tensors (host vendor, discrete profile) through dist.send/recv on the dicomm backend: device-
direct between local processes, with no staging copy; staged through host memory when switched off."""
import pytest

from torch_jobs import assert_passed_on_every_rank, run_job

DISCRETE = {"DIPU_HOST_PROFILE": "discrete"}


@pytest.mark.slow
def test_dist_send_recv_of_dipu_tensors_makes_no_staging_copy():
    ranks = run_job("dipu_p2p", world_size=2, env=DISCRETE, staged=False)
    assert_passed_on_every_rank(ranks, "dipu_tensors_arrive_intact")
    assert_passed_on_every_rank(ranks, "vendor_copies_are_the_expected_ones")


@pytest.mark.slow
def test_with_device_direct_off_dist_send_recv_stages_dipu_tensors_through_host_memory():
    ranks = run_job("dipu_p2p", world_size=2, env={**DISCRETE, "DICOMM_DEVICE_DIRECT": "0"}, staged=True)
    assert_passed_on_every_rank(ranks, "dipu_tensors_arrive_intact")
    assert_passed_on_every_rank(ranks, "vendor_copies_are_the_expected_ones")
