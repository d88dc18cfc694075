"""DiComm maps device memory directly only inside a group whose members all run their device on one vendor:
a group with a host-vendor member and an OpenCL member stages device tensors through host memory."""
from __future__ import annotations

import threading

import torch.distributed as dist

from dicomm.torch_backend import device_memory_for_group

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
