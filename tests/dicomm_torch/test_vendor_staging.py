"""DiComm maps device memory directly only inside a group whose members all run their device on one vendor:
a group with a host-vendor member and an OpenCL member stages device tensors through host memory."""
from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from dicomm.torch_backend import device_memory_for_group
from torch_jobs import assert_passed_on_every_rank, run_job

FUNCTIONS = {"export": 1, "open": 2, "close": 3, "copy": 4, "last_error": 5}


def members_device_memory(vendors: list[str | None]) -> list:
    """What each member of a group of len(vendors) gets, each member in its own thread on one store."""
    store = dist.HashStore()
    results = [None] * len(vendors)

    def member(rank: int) -> None:
        results[rank] = device_memory_for_group(store, rank, len(vendors), vendors[rank], FUNCTIONS)

    threads = [threading.Thread(target=member, args=(rank, )) for rank in range(len(vendors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_members_of_one_vendor_keep_their_device_memory_functions():
    assert members_device_memory(["libdipu_vendor_host.so"] * 3) == [FUNCTIONS] * 3


def test_a_group_mixing_vendors_stages_through_host_memory_on_every_member():
    assert members_device_memory(["libdipu_vendor_host.so", "libdipu_vendor_opencl.so"]) == [None, None]


def test_a_member_without_a_device_vendor_makes_the_group_stage():
    assert members_device_memory(["libdipu_vendor_host.so", None]) == [None, None]


@pytest.mark.slow
def test_dipu_tensors_move_between_a_host_vendor_rank_and_an_opencl_rank_through_host_memory():
    ranks = run_job("mixed_vendor_p2p", world_size=2, env={"DIPU_HOST_PROFILE": "discrete"}, timeout=240,
                    vendors=["host", "opencl"])
    for name in ("each_rank_runs_its_vendor", "dipu_tensors_arrive_intact", "the_host_vendor_rank_staged_its_sends"):
        assert_passed_on_every_rank(ranks, name)
