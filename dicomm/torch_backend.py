"""Registers DiComm as the torch.distributed backend "dicomm".

Imported by ``import dicomm`` when torch is installed. After it, ``init_process_group("dicomm")``,
``new_group(backend="dicomm")`` and per-device strings such as ``"cpu:gloo,dipu:dicomm"`` work.
The backend serves CPU tensors and, once the PrivateUse1 backend has been renamed (``dipu``),
that device's tensors too: point-to-point device-direct where the device announced its memory
functions (``h2.core.devices.device_memory``), the peer is on the same host and every member of the group
runs its device on the same vendor (``h2.core.devices.device_vendor``), staged through host memory
otherwise. It announces the device types it serves to ``h2.core.devices`` (where "which backend
serves a device" is decided) and extends itself to a device type registered later (``dipu`` imported after ``dicomm``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.distributed as dist

from dicomm import _dicomm_c10d
from dicomm.endpoint import environment_options
from h2.core import devices
from h2.core.links import Link

BACKEND_NAME = "dicomm"
VENDOR_KEY = "dicomm/device-vendor/"  # + group rank: the vendor of that member's device


def backend_devices() -> list[str]:
    """Device types the backend takes tensors of: cpu, plus the renamed PrivateUse1 device."""
    devices = ["cpu"]
    private_use = torch._C._get_privateuse1_backend_name()
    if private_use != "privateuseone":
        devices.append(private_use)
    return devices


@dataclass(frozen=True)
class GroupOptions:
    """A dicomm group's options (``new_group(..., backend="dicomm", pg_options=GroupOptions(...))``):
    ``links`` maps global ranks to the emulated link (h2.core.links.Link) that paces what this rank
    sends to each of them (docs/dicomm.md, "Link emulation")."""
    links: Mapping[int, Link] = field(default_factory=dict)


def _create_backend(common, options: GroupOptions | None):
    """torch.distributed's extended creator call: `common` carries the store, group rank and size,
    timeout and the group's global ranks; `options` is the group's pg_options."""
    global_ranks = list(common.global_ranks_in_group) or list(range(common.group_size))
    peer_links = {}
    if options is not None:
        if not isinstance(options, GroupOptions):
            raise TypeError(
                f"dicomm: pg_options must be dicomm.torch_backend.GroupOptions, got {type(options).__name__}")
        for group_rank, global_rank in enumerate(global_ranks):
            link = options.links.get(global_rank)
            if link is not None and group_rank != common.group_rank:
                peer_links[group_rank] = (link.bytes_per_s, link.latency_s)
    environment_options()  # the C++ backend reads the DICOMM_* environment itself: refused here in one line
    device_memory = _group_device_memory(common.store, common.group_rank, common.group_size)
    return _dicomm_c10d.create_backend(common.store, common.group_rank, common.group_size,
                                       common.timeout.total_seconds(), peer_links, device_memory)


def _group_device_memory(store, group_rank: int, group_size: int) -> Mapping[str, int] | None:
    """This process's device memory functions for a new group, or None when not every member's device
    runs on this process's vendor."""
    private_use = torch._C._get_privateuse1_backend_name()
    registered = private_use != "privateuseone"
    vendor = devices.device_vendor(private_use) if registered else None
    functions = devices.device_memory(private_use) if registered else None
    return device_memory_for_group(store, group_rank, group_size, vendor, functions)


def device_memory_for_group(store, group_rank: int, group_size: int, vendor: str | None,
                            functions: Mapping[str, int] | None) -> Mapping[str, int] | None:
    """`functions` where every member of the group announced the same device `vendor` through `store` (the
    group's); else None, so that device tensors are staged through host memory: memory one vendor exports
    cannot be mapped by another's runtime. Every member calls it (each waits for the others' vendor)."""
    store.set(f"{VENDOR_KEY}{group_rank}", vendor or "")
    vendors = {store.get(f"{VENDOR_KEY}{rank}").decode() for rank in range(group_size)}
    return functions if functions is not None and vendor and vendors == {vendor} else None


def register() -> None:
    """Registers (or re-registers, picking up a renamed PrivateUse1 device) the backend."""
    served = backend_devices()
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=served)
    for device_type in served:
        if device_type != "cpu":
            devices.serve_device(device_type, BACKEND_NAME)


def _on_device_type_registered(device_type: str) -> None:
    if device_type == torch._C._get_privateuse1_backend_name():
        register()


def transport_of(peer: int, group: dist.ProcessGroup | None = None) -> str:
    """The transport ("shm", "tcp", "ibverbs") the group's dicomm backend uses to reach group rank ``peer``."""
    group = group or dist.group.WORLD
    return _dicomm_c10d.transport_of(group._get_backend(torch.device("cpu")), peer)


register()
devices.on_device_type_registered(_on_device_type_registered)
