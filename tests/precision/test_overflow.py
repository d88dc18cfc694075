"""Overflow check: the first op producing NaN/Inf from finite inputs is named, with input statistics."""

from __future__ import annotations

import pytest
import torch

from conftest import build_tiny, tiny_batch, training_step
from ditorch.op_tools import OpOverflowCheck
from ditorch.op_tools.overflow import OpOverflowError


def test_injected_overflow_names_the_first_op_and_its_module():
    model, tokens = build_tiny(), tiny_batch()
    with torch.no_grad():
        model.layers[2].mlp.up_proj.weight.fill_(1e38)  # finite weights whose sums of products overflow
    with OpOverflowCheck(report=None) as check:
        loss = training_step(model, tokens)
    first = check.first
    assert first.op == "aten.mm.default" and first.phase == "forward"
    assert first.module == "Transformer.layers.2.mlp.up_proj"
    assert first.kind in ("inf", "nan+inf")
    weight_stats = max(first.input_stats, key=lambda s: s.get("abs_max", 0))
    assert weight_stats["abs_max"] == pytest.approx(1e38) and weight_stats["nan"] == 0 and weight_stats["inf"] == 0
    assert "Transformer.layers.2.mlp.up_proj" in first.describe() and "absmax" in first.describe()
    assert not torch.isfinite(loss)


def test_ops_that_only_propagate_nan_are_not_origins():
    x = torch.tensor([1.0, 0.0])
    with OpOverflowCheck(report=None) as check:
        y = x / x  # 0/0 -> nan: the origin
        z = (y * 2).exp()
    assert [event.op for event in check.events] == ["aten.div.Tensor"]
    assert check.first.kind == "nan" and torch.isnan(z).any()


def test_range_dtype_flags_values_beyond_float16_in_float32():
    x = torch.tensor([300.0, 2.0])
    with OpOverflowCheck(range_dtype=torch.float16, report=None) as check:
        x * x  # 90000 > float16 max 65504
    assert check.first.kind == "beyond float16 range" and check.first.op == "aten.mul.Tensor"


def test_raise_on_overflow_stops_at_the_origin():
    with OpOverflowCheck(raise_on_overflow=True, report=None):
        with pytest.raises(OpOverflowError, match=r"aten\.exp\.default .* produced inf"):
            torch.tensor([1000.0]).exp()


def test_clean_step_reports_no_overflow():
    model, tokens = build_tiny(), tiny_batch()
    with OpOverflowCheck(report=None) as check:
        training_step(model, tokens)
    assert check.events == [] and check.checked > 100
    assert "no overflow" in check.summary()
