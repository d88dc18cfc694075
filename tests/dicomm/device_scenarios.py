"""Scenarios moving dipu tensors (host vendor, `discrete` profile: the CPU cannot touch device
memory) between two ranks through dicomm.Endpoint, counting the vendor's copies by kind."""
from __future__ import annotations

import tempfile

import numpy as np
import torch

import dicomm
from h2.core import devices
from h2.core.ranks import run_ranks
from scenarios import barrier, pattern

DEVICE_SIZES = [1, 4096, (1 << 20) + 3, 8 << 20]


def _endpoint(rank, world, store_dir, direct: bool) -> dicomm.Endpoint:
    devices.resolve_device("dipu")
    return dicomm.Endpoint(dicomm.FileStore(store_dir, timeout=30), rank, world, timeout=60,
                           device_memory=devices.device_memory("dipu"), device_direct=direct)


def _on_device(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(values.copy()).to("dipu")


def _region(tensor: torch.Tensor, start: int = 0, size: int | None = None) -> tuple[int, int]:
    return tensor.data_ptr() + start, tensor.numel() * tensor.element_size() - start if size is None else size


def _copies() -> dict[str, int]:
    from ditorch.dipu import memory_ipc
    return memory_ipc.copy_counts()


def _since(before: dict[str, int]) -> dict[str, int]:
    return {kind: count - before[kind] for kind, count in _copies().items()}


def transfer(rank, world, store_dir, transport, args):
    """Every DEVICE_SIZES message from rank 0's dipu tensors into rank 1's; copies counted around the
    transfers only."""
    ep = _endpoint(rank, world, store_dir, args["direct"])
    sources = [_on_device(pattern(size, 3)) for size in DEVICE_SIZES] if rank == 0 else []
    targets = [torch.zeros(size, dtype=torch.uint8, device="dipu") for size in DEVICE_SIZES] if rank == 1 else []
    barrier(ep)
    before = _copies()
    for i in range(len(DEVICE_SIZES)):
        if rank == 0:
            ep.send(_region(sources[i]), 1, tag=i, device=True)
        else:
            ep.recv(_region(targets[i]), 0, tag=i, device=True)
    copies = _since(before)
    intact = [bool(np.array_equal(t.cpu().numpy(), pattern(size, 3))) for t, size in zip(targets, DEVICE_SIZES)]
    return {"device_direct": ep.device_direct(1 - rank), "copies": copies, "intact": intact}


def overrun(rank, world, store_dir, transport, args):
    """Rank 0 sends 64 KiB + 1 bytes of device memory; rank 1's device receive is the middle 64 KiB of
    a 192 KiB tensor filled with 0x5A."""
    ep = _endpoint(rank, world, store_dir, True)
    piece = 64 << 10
    found = {}
    if rank == 0:
        source = _on_device(pattern(piece + 1))
        barrier(ep)
        try:
            ep.send(_region(source), 1, device=True)
        except dicomm.CommError as error:
            found["send_error"] = str(error)
    else:
        target = torch.full((3 * piece, ), 0x5A, dtype=torch.uint8, device="dipu")
        handle = ep.irecv(_region(target, piece, piece), 0, device=True)
        barrier(ep)
        try:
            handle.wait()
        except dicomm.CommError as error:
            found["recv_error"] = str(error)
        found["untouched"] = bool((target.cpu() == 0x5A).all())
    return found


def host_into_device(rank, world, store_dir, transport, args):
    """Rank 0 sends host bytes; rank 1 posts a device receive."""
    ep = _endpoint(rank, world, store_dir, True)
    found = {}
    if rank == 0:
        ep.send(pattern(4096), 1)
    else:
        target = torch.zeros(4096, dtype=torch.uint8, device="dipu")
        try:
            ep.recv(_region(target), 0, device=True)
        except dicomm.CommError as error:
            found["recv_error"] = str(error)
    return found


def device_into_host(rank, world, store_dir, transport, args):
    """Rank 0 sends 1 MiB of device memory; rank 1 receives it into host memory."""
    ep = _endpoint(rank, world, store_dir, True)
    size = 1 << 20
    if rank == 0:
        ep.send(_region(_on_device(pattern(size, 9))), 1, device=True)
        return {}
    target = np.zeros(size, np.uint8)
    ep.recv(target, 0)
    return {"intact": bool(np.array_equal(target, pattern(size, 9)))}


def run(scenario: str, **args) -> list[dict]:
    env = {"DIPU_HOST_PROFILE": "discrete"}
    return run_ranks(globals()[scenario], 2, (tempfile.mkdtemp(prefix="dicomm-device-"), "shm", args), env=env,
                     timeout=180)
