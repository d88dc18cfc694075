"""What every script in this folder prints, so a test can compare a run on one device with another.

`step N loss X` per step, then one `result {...}` JSON line: the parameter count, how many distinct
parameter tensors there are, whether the optimizer holds exactly the model's parameters (by object),
the ties the script declares, the device and the losses. Only torch; these scripts never name ditorch.
"""

import json
import os

import torch


def log_step(step: int, loss: float) -> None:
    print(f"step {step} loss {loss:.6f}", flush=True)


def emit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, losses: list, ties=(), **extra) -> None:
    parameters = list(model.parameters())
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    result = {
        "rank": int(os.environ.get("RANK", 0)),
        "parameters": sum(p.numel() for p in parameters),
        "parameter_tensors": len(parameters),
        "optimizer_holds_model_parameters": {id(p) for p in optimized} == {id(p) for p in parameters},
        "ties_kept": [a is b for a, b in ties],
        "device": str(parameters[0].device),
        "losses": [float(loss) for loss in losses],
        **extra,
    }
    print("result " + json.dumps(result), flush=True)
