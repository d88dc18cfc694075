"""Training runs the OpenCL vendor's tests compare with the CPU: a TransformerEncoderLayer and the
project's model (a preset of h2.model.Transformer), each trained with AdamW from the same seed on the
same random batch. Run as a script (`opencl_training.py encoder|tiny|small STEPS [LR|h2]`) in a process
whose DIPU_VENDOR is opencl, it prints the losses of both devices and the operators that fell back to the
CPU as JSON. LR is a constant learning rate; `h2` trains with `h2 train`'s defaults instead (TrainConfig:
warm-up to lr 3e-3 over 20 steps, betas 0.9/0.95, weight decay 0.1, gradients clipped to norm 1).

`opencl_training.py floor small STEPS [LR|h2]` runs the CPU only, twice: as it is, and with every linear
layer's GEMMs (forward and backward) computed in float64 and rounded to float32, which is another valid
float32 result of the same GEMM (more accurate than either). The difference between the two is the
float32 rounding floor of the run: no vendor whose GEMMs do not add in MKL's exact order can come closer.
Prints {"cpu": ..., "cpu_float64_gemms": ...}."""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

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


class Float64Gemms(torch.overrides.TorchFunctionMode):
    """Every F.linear of float32 operands computed in float64 and rounded to float32 (its backward too)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and all(a.dtype == torch.float32 for a in args if isinstance(a, torch.Tensor)):
            wide = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
            return func(*wide, **kwargs).float()
        return func(*args, **kwargs)


def h2_learning_rate(step: int) -> float:
    """`h2 train`'s default schedule (TrainConfig) at `step`, for a run of 20 steps."""
    from h2.core.training import TrainConfig
    from h2.train.lr_schedule import learning_rate

    config = TrainConfig()
    return learning_rate(step, lr=config.lr, min_lr=config.min_lr, warmup_steps=config.warmup_steps, decay_steps=20)


def model_losses(device: str, steps: int, name: str, batch: int = 2, seq: int = 32,
                 lr: float | str = 1e-3) -> list[float]:
    config = preset(name)
    torch.manual_seed(0)
    model = Transformer(config).to(device)
    h2_defaults = lr == "h2"
    optimizer = torch.optim.AdamW(model.parameters(), lr=h2_learning_rate(0) if h2_defaults else lr, weight_decay=0.1,
                                  betas=(0.9, 0.95) if h2_defaults else (0.9, 0.999), foreach=False)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=generator)
    inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    losses = []
    for step in range(steps):
        loss = language_model_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        if h2_defaults:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
            for group in optimizer.param_groups:
                group["lr"] = h2_learning_rate(step)
        optimizer.step()
        losses.append(loss.item())
    return losses


def rounding_floor(name: str, steps: int, lr: float | str) -> None:
    cpu = model_losses("cpu", steps, name, lr=lr)
    with Float64Gemms():
        wide = model_losses("cpu", steps, name, lr=lr)
    print(json.dumps({"cpu": cpu, "cpu_float64_gemms": wide}))


def main(which: str, steps: int, lr: float | str = 1e-3) -> None:
    import ditorch.dipu as dipu

    run = encoder_layer_losses if which == "encoder" else (lambda d, s: model_losses(d, s, which, lr=lr))
    cpu = run("cpu", steps)
    dipu.reset_fallback_counts()
    on_dipu = run("dipu", steps)
    print(json.dumps({"vendor": dipu.vendor_name(), "cpu": cpu, "dipu": on_dipu, "fallbacks": dipu.fallback_counts()}))


def learning_rate_argument(text: str) -> float | str:
    return text if text == "h2" else float(text)


if __name__ == "__main__":
    if sys.argv[1] == "floor":
        rounding_floor(sys.argv[2], int(sys.argv[3]), *(learning_rate_argument(lr) for lr in sys.argv[4:]))
    else:
        main(sys.argv[1], int(sys.argv[2]), *(learning_rate_argument(lr) for lr in sys.argv[3:]))
