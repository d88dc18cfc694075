"""A DistributedDataParallel trainer in the style of the PyTorch DDP tutorial: torchrun sets the
ranks, the process group takes the default backend, and the script checks it is NCCL on GPUs.

    torchrun --nproc-per-node 2 ddp_trainer.py [--device cpu]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from run_report import emit, log_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(f"cuda:{local_rank}")
        dist.init_process_group()
        assert dist.get_backend() == "nccl", dist.get_backend()
        device = torch.device("cuda", local_rank)
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(128, 16, generator=generator)
    dataset = TensorDataset(features, (features[:, :4] * 3).tanh())
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, pin_memory=args.device == "cuda")

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if args.device == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
    losses, step, epoch = [], 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = nn.functional.mse_loss(ddp_model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            losses.append(reduced.item() / dist.get_world_size())
            log_step(step, losses[-1])
            step += 1
            if step == args.steps:
                break
        epoch += 1
    checksum = sum(p.detach().double().sum() for p in model.parameters()).item()
    emit(model, optimizer, losses, checksum=checksum)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
