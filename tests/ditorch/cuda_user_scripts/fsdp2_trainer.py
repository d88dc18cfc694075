"""An FSDP2 trainer in the style of torchtitan: a device mesh, fully_shard on every block and the root,
a full-state-dict gather at the end.

    torchrun --nproc-per-node 2 fsdp2_trainer.py [--device cpu]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from run_report import emit, log_step


class Block(nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    world_size, local_rank = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
    mesh = init_device_mesh(args.device, (world_size, ), mesh_dim_names=("dp", ))

    torch.manual_seed(0)
    with torch.device("meta"):
        model = nn.Sequential(*[Block(32) for _ in range(2)], nn.Linear(32, 8))
    for block in model[:2]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=args.device)
    torch.manual_seed(0)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm)):
            module.reset_parameters()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    generator = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(16, 32, generator=generator)
    y = x[:, :8].sin()
    losses = []
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(x.to(args.device)), y.to(args.device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        log_step(step, losses[-1])
    full = {name: p.full_tensor() for name, p in model.named_parameters()}
    checksum = sum(t.double().sum() for t in full.values()).item()
    emit(model, optimizer, losses, checksum=checksum, full_parameters=sum(t.numel() for t in full.values()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
