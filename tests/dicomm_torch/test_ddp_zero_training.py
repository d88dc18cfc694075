"""DistributedDataParallel and ZeroRedundancyOptimizer on the dicomm backend give gloo's parameters."""
import pytest

from torch_jobs import assert_passed_on_every_rank, run_job


@pytest.fixture(scope="module")
def ranks():
    return run_job("training", world_size=2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["ddp_with_dicomm_matches_gloo", "zero_redundancy_optimizer_with_dicomm_matches_plain_adam_over_gloo"])
def test_training(ranks, name):
    assert_passed_on_every_rank(ranks, name)
