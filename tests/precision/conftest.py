"""Fixtures for the precision tools: a tiny h2 model and one training step, single-threaded
(the tools run many small ops; a shared 2-core machine makes thread pools slow)."""

from __future__ import annotations

import pytest
import torch

from ditorch.op_tools.tool import OpTool


@pytest.fixture(autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Perturb(OpTool):
    """Test-only stand-in for a chip that computes the selected ops slightly differently:
    multiplies their floating outputs by (1 + relative)."""

    tool_name = "perturb"

    def __init__(self, ops=None, *, relative: float = 1e-3, **filters):
        super().__init__(ops, **filters)
        self.relative = relative
        self.calls = 0

    def handle(self, call):
        out = call.run()
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        self.calls += 1
        return out * (1 + self.relative)


def build_tiny(seed: int = 0):
    from h2.core.model_config import preset
    from h2.model.transformer import Transformer

    torch.manual_seed(seed)
    return Transformer(preset("tiny"))


def tiny_batch(seed: int = 1, batch: int = 2, seq: int = 16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, seq + 1), generator=generator)


def training_step(model, tokens, optimizer=None) -> torch.Tensor:
    """Forward, loss, backward and (with an optimizer) the update: one full training step."""
    from h2.model.transformer import language_model_loss

    logits = model(tokens[:, :-1])
    loss = language_model_loss(logits, tokens[:, 1:])
    loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()
