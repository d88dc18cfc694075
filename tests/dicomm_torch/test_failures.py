"""A dead or silent peer makes pending work fail with an error naming peer and op, never hang."""
import pytest

from torch_jobs import run_job, start_job


@pytest.fixture(scope="module")
def survivor():
    with start_job("killed_peer", world_size=2) as job:
        (findings, ) = job.results(ranks=[0], timeout=60)
        assert job.wait(1, timeout=30) == -9  # rank 1 killed itself
    return findings


@pytest.mark.slow
@pytest.mark.parametrize("op", ["recv", "all_reduce"])
def test_pending_work_fails_soon_after_the_peer_is_killed(survivor, op):
    assert survivor[f"{op}_fails_when_the_peer_dies"] is None, survivor[f"{op}_fails_when_the_peer_dies"]
    error = survivor[f"{op}_error"]
    assert "rank 1" in error and op in error
    assert survivor[f"{op}_seconds"] < 10, "the group timeout is 60 s; peer death must be noticed well before"


@pytest.fixture(scope="module")
def waiter():
    return run_job("timeout", world_size=2, timeout_s=2.0)[0]


@pytest.mark.slow
@pytest.mark.parametrize("op", ["recv", "all_reduce"])
def test_pending_work_fails_after_the_process_group_timeout(waiter, op):
    assert waiter[f"{op}_fails_after_the_timeout"] is None, waiter[f"{op}_fails_after_the_timeout"]
    error = waiter[f"{op}_error"]
    assert "timed out" in error and "rank 1" in error and op in error
    assert 1.5 < waiter[f"{op}_seconds"] < 6
