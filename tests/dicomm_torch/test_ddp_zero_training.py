"""DistributedDataParallel and ZeroRedundancyOptimizer on the dicomm backend give gloo's parameters."""
import pytest

from torch_jobs import run_job


@pytest.fixture(scope="module")
def ranks():
    return run_job("training", world_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp_with_dicomm_matches_gloo",
                                  "zero_redundancy_optimizer_with_dicomm_matches_plain_adam_over_gloo"])
def test_training(ranks, name):
    for rank, findings in enumerate(ranks):
        assert findings[name] is None, f"rank {rank}: {findings[name]}"
