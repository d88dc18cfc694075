"""The outer optimizer of one layer on a shard: SGD with momentum, Nesterov or plain, on flat vectors.

Matches torch.optim.SGD (dampening 0, no weight decay): buf = momentum * buf + g (buf = g on the
first step); the step is g + momentum * buf with Nesterov, buf without; theta -= lr * step. It works
out of place: `stepped` returns the new parameters and momentum, so a round can be prepared on every
shard and committed (or abandoned) everywhere at once.
"""

from __future__ import annotations

import torch

from h2.core.dips import OuterOptions


def stepped(options: OuterOptions, theta: torch.Tensor, momentum: torch.Tensor | None,
            gradient: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(new parameters, new momentum buffer) after one outer step on `gradient`."""
    if options.momentum == 0:
        return theta - options.lr * gradient, None
    buffer = gradient.clone() if momentum is None else options.momentum * momentum + gradient
    step = gradient + options.momentum * buffer if options.optimizer == "nesterov" else buffer
    return theta - options.lr * step, buffer
