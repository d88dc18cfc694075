"""A small training script written the way a CUDA user writes one (this file never mentions ditorch).

Single process:  python train_cuda.py --steps 20
Data parallel:   torchrun --nproc-per-node 2 train_cuda.py --steps 20
Prints one `step N loss X` line per step and a final `result {...}` JSON line.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.LayerNorm(4 * width), nn.Linear(4 * width, width))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True

    distributed = "LOCAL_RANK" in os.environ
    if distributed:
        dist.init_process_group(backend="nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cuda")

    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    model = build_model(args.width).cuda()
    if distributed:
        model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")

    generator = torch.Generator().manual_seed(1234 + (dist.get_rank() if distributed else 0))
    inputs_cpu = torch.randn(args.steps, 32, args.width, generator=generator).pin_memory()
    target = torch.zeros(32, args.width, device="cuda")

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    losses = []
    for step in range(args.steps):
        batch = inputs_cpu[step].to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            output = model(batch)
        loss = nn.functional.mse_loss(output.float(), target + batch)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
        sys.stdout.write(f"step {step} loss {losses[-1]:.6f}\n")
        sys.stdout.flush()
    end.record()
    torch.cuda.synchronize()

    parameters = model.module.parameters() if distributed else model.parameters()
    checksum = sum(float(p.detach().double().sum().cpu()) for p in parameters)
    result = {
        "device": str(next(model.parameters()).device),
        "device_name": torch.cuda.get_device_name(),
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "elapsed_ms": start.elapsed_time(end),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "checksum": checksum,
        "rank": dist.get_rank() if distributed else 0,
    }
    # One write per line: with PYTHONUNBUFFERED print() writes the text and the newline separately,
    # and two ranks sharing torchrun's stdout could interleave them.
    sys.stdout.write("result " + json.dumps(result) + "\n")
    sys.stdout.flush()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
