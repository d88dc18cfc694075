"""Mixed precision as the PyTorch AMP recipe shows it: float16 autocast with a GradScaler."""

import argparse

import torch
import torch.nn as nn

from run_report import emit, log_step


def make_model(in_size, out_size, num_layers):
    layers = []
    for _ in range(num_layers - 1):
        layers += [nn.Linear(in_size, in_size), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(in_size, out_size))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device, use_amp = args.device, True
    torch.manual_seed(0)
    inputs = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    targets = inputs[:, :16].clone() * 2

    net = make_model(64, 16, 3).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, enabled=use_amp)
    loss_fn = nn.MSELoss()
    losses = []
    for step in range(args.steps):
        x, y = inputs.to(device), targets.to(device)
        with torch.autocast(device_type=device, dtype=torch.float16, enabled=use_amp):
            output = net(x)
            assert output.dtype is torch.float16
            loss = loss_fn(output, y)
        assert loss.dtype is torch.float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        losses.append(loss.item())
        log_step(step, losses[-1])
    emit(net, opt, losses, scale=scaler.get_scale())


if __name__ == "__main__":
    main()
