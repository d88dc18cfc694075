"""Tensor parallelism over a DeviceMesh, as in the PyTorch TP tutorial: a feed-forward block split
column-wise then row-wise across the ranks (DTensor parameters), with the random seed synchronised.

    torchrun --nproc-per-node 2 tensor_parallel.py [--device cpu]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from run_report import emit, log_step


class FeedForward(nn.Module):

    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    world_size = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh(args.device, (world_size, ), mesh_dim_names=("tp", ))
    torch.manual_seed(0)
    model = FeedForward(16, 64).to(args.device)
    model = parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))  # every rank feeds the same batch
    y = x.flip(1)
    losses = []
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(x.to(args.device)), y.to(args.device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        log_step(step, losses[-1])
    checksum = sum(p.full_tensor().double().sum() for p in model.parameters()).item()
    emit(model, optimizer, losses, checksum=checksum)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
