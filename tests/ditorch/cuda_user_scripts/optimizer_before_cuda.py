"""A trainer that builds its optimizer before moving the model to the GPU, then saves a checkpoint
and resumes from it (map_location to the device), as older tutorials do."""

import argparse
import io

import torch
import torch.nn as nn

from run_report import emit, log_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # before the move
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    if args.device == "cuda":
        model.cuda()
    else:
        model.to(args.device)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    losses = []
    for step in range(args.steps):
        if step == args.steps // 2:  # checkpoint and resume, as after a preemption
            buffer = io.BytesIO()
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                buffer)
            buffer.seek(0)
            state = torch.load(buffer, map_location=args.device)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        xb, yb = x.to(args.device), y.to(args.device)
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        log_step(step, losses[-1])
    emit(model, optimizer, losses)


if __name__ == "__main__":
    main()
