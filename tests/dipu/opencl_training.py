"""Training runs the OpenCL vendor's tests compare with the CPU: a TransformerEncoderLayer and the
project's model (a preset of h2.model.Transformer), each trained with AdamW from the same seed on the
same random batch. Run as a script (`opencl_training.py encoder|tiny|small STEPS [LR]`) in a process
whose DIPU_VENDOR is opencl, it prints the losses of both devices and the operators that fell back to the
CPU as JSON."""
from __future__ import annotations

import json
import sys

import torch

from h2.core.model_config import preset
from h2.model import Transformer
from h2.model.transformer import language_model_loss


def encoder_layer_losses(device: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True).to(device)
    head = torch.nn.Linear(32, 8).to(device)
    parameters = list(layer.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=3e-3, weight_decay=0.1, foreach=False)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(4, 10, 32, generator=generator).to(device)
    targets = torch.randint(0, 8, (4 * 10, ), generator=generator).to(device)
    losses = []
    for _ in range(steps):
        logits = head(layer(inputs)).reshape(-1, 8)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def model_losses(device: str, steps: int, name: str, batch: int = 2, seq: int = 32, lr: float = 1e-3) -> list[float]:
    config = preset(name)
    torch.manual_seed(0)
    model = Transformer(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, foreach=False)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=generator)
    inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    losses = []
    for _ in range(steps):
        loss = language_model_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(which: str, steps: int, lr: float = 1e-3) -> None:
    import ditorch.dipu as dipu

    run = encoder_layer_losses if which == "encoder" else (lambda d, s: model_losses(d, s, which, lr=lr))
    cpu = run("cpu", steps)
    dipu.reset_fallback_counts()
    on_dipu = run("dipu", steps)
    print(json.dumps({"vendor": dipu.vendor_name(), "cpu": cpu, "dipu": on_dipu, "fallbacks": dipu.fallback_counts()}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(float(lr) for lr in sys.argv[3:]))
