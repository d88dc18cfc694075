"""Rank jobs for the device-generic PyTorch tests: FSDP2 and a device mesh on the dipu device, written as
current PyTorch examples write them (torch.accelerator, get_default_backend_for_device, device_id=)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

STEPS = 4


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batches(world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's global batch (world_size * 2 rows); rank r trains on rows [2r, 2r + 2)."""
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(2 * world_size, 8, generator=generator), torch.randn(2 * world_size, 4, generator=generator))
            for _ in range(STEPS)]


def single_process_losses(world_size: int) -> list[float]:
    """The reference: one process, whole global batch, on the CPU."""
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for inputs, targets in batches(world_size):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _init(device: torch.device) -> str:
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, device_id=device)
    return backend


def fsdp2_losses(rank: int, world_size: int) -> dict:
    """fully_shard over the accelerator of this rank; the global loss of each step (mean over ranks)."""
    from torch.distributed.fsdp import fully_shard

    import ditorch  # noqa: F401  (registers dipu: the device torch.accelerator answers)

    accelerator = torch.accelerator.current_accelerator()
    device = torch.device(accelerator.type, int(os.environ["LOCAL_RANK"]))
    torch.accelerator.set_device_index(device.index)
    backend = _init(device)
    try:
        model = tiny_model().to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for inputs, targets in batches(world_size):
            rows = slice(2 * rank, 2 * rank + 2)
            loss = torch.nn.functional.mse_loss(model(inputs[rows].to(device)), targets[rows].to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
            losses.append(global_loss.item())
        torch.accelerator.synchronize()
        parameter_devices = sorted({str(p.to_local().device) for p in model.parameters()})
        return {"backend": backend, "device": str(device), "losses": losses, "parameter_devices": parameter_devices}
    finally:
        dist.destroy_process_group()


def mesh_placement(rank: int, world_size: int) -> dict:
    """init_device_mesh("dipu", ...) then .to("dipu"): where this rank's tensors land."""
    from torch.distributed.device_mesh import init_device_mesh

    import ditorch  # noqa: F401

    mesh = init_device_mesh("dipu", (world_size, ))
    try:
        tensor = torch.full((3, ), float(rank)).to("dipu")
        gathered = [torch.empty(3, device="dipu") for _ in range(world_size)]
        dist.all_gather(gathered, tensor)
        return {
            "mesh_device_type": mesh.device_type, "tensor_device": str(tensor.device),
            "current_index": torch.accelerator.current_device_index(), "gathered": [t.cpu().tolist() for t in gathered
                                                                                    ], "backend": dist.get_backend()
        }
    finally:
        dist.destroy_process_group()
