"""The split backward: B leaves weight gradients to a later W pass, and W produces exactly what a
plain backward would, with or without activation recompute."""

from __future__ import annotations

import pytest
import torch

from h2.core.model_config import preset
from h2.model.transformer import Transformer
from heteropp.stage import apply_recompute, build_stage
from heteropp.tensor_parallel import ShardLinear, WeightGradStore, apply_tp


def stage_and_store(recompute: bool):
    torch.manual_seed(0)
    store = WeightGradStore()
    stage = apply_tp(build_stage(Transformer(preset("tiny")), range(1, 3), first=False, last=False), tp_index=0,
                     tp_size=1, group=None, store=store)
    return (apply_recompute(stage) if recompute else stage), store


@pytest.mark.parametrize("recompute", [False, True])
def test_deferred_weight_gradients_equal_the_plain_backward(recompute):
    x = torch.randn(2, 8, 64)
    grad = torch.randn(2, 8, 64)

    plain, _ = stage_and_store(recompute)
    inputs = x.clone().requires_grad_()
    torch.autograd.backward(plain(inputs), grad)
    expected = {name: p.grad.clone() for name, p in plain.named_parameters()}

    split, store = stage_and_store(recompute)
    split_inputs = x.clone().requires_grad_()
    store.deferring = True
    torch.autograd.backward(split(split_inputs), grad)
    store.deferring = False
    linears = [m.weight for m in split.modules() if isinstance(m, ShardLinear)]
    assert linears and all(w.grad is None for w in linears)  # B: no weight gradients yet
    torch.testing.assert_close(split_inputs.grad, inputs.grad)  # but the input gradient is complete
    WeightGradStore.run(store.take())  # W
    for name, param in split.named_parameters():
        assert not param.grad.requires_grad  # W records no graph
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-6, atol=1e-7)
