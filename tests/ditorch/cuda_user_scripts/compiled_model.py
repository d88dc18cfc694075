"""A trainer that compiles its model with torch.compile, as the PyTorch 2 tutorials recommend."""

import argparse

import torch
import torch.nn as nn

from run_report import emit, log_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8)).to(args.device)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    y = x[:, :8].cos()
    losses = []
    for step in range(args.steps):
        loss = nn.functional.mse_loss(compiled(x.to(args.device)), y.to(args.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        log_step(step, losses[-1])
    emit(model, optimizer, losses)


if __name__ == "__main__":
    main()
