"""Time measure, dtype cast, observe, and the rules every tool shares: nothing hooked when no tool
is active, start()/stop() equal to the context manager, stopping in reverse order."""

from __future__ import annotations

import csv

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import _get_current_dispatch_mode

from conftest import build_tiny, tiny_batch, training_step
from ditorch.op_tools import OpDtypeCast, OpFallback, OpObserve, OpTimeMeasure
from ditorch.op_tools.dtype_cast import parse_casts


def global_module_hooks() -> int:
    return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)


def test_no_tool_active_means_nothing_hooked():
    assert global_module_hooks() == 0 and _get_current_dispatch_mode() is None
    tool = OpObserve(report=None).start()
    assert global_module_hooks() == 2 and _get_current_dispatch_mode() is tool
    tool.stop()
    assert global_module_hooks() == 0 and _get_current_dispatch_mode() is None


def test_tools_must_stop_in_reverse_order():
    first, second = OpObserve(report=None).start(), OpTimeMeasure(report=None).start()
    with pytest.raises(RuntimeError, match="reverse order"):
        first.stop()
    second.stop()
    first.stop()
    assert global_module_hooks() == 0


def test_time_measure_writes_one_row_per_call_and_totals(tmp_path):
    model, tokens = build_tiny(), tiny_batch()
    path = tmp_path / "time.csv"
    with OpTimeMeasure(csv_path=str(path), report=None) as timer:
        training_step(model, tokens)
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(timer.rows) > 100
    assert all(float(row["time_ms"]) >= 0 and row["device"] == "cpu" for row in rows)
    totals = timer.totals()
    assert sum(t.calls for t in totals) == len(rows)
    assert sum(t.total_ms for t in totals) == pytest.approx(sum(float(r["time_ms"]) for r in rows))
    assert [t.total_ms for t in totals] == sorted((t.total_ms for t in totals), reverse=True)
    table = timer.format_totals(limit=5)
    assert table.splitlines()[0].split() == ["op", "calls", "total", "ms", "mean", "ms", "share"]
    assert "aten.mm.default forward" in timer.format_totals(limit=100)


def test_dtype_cast_runs_selected_op_widened_and_returns_the_original_dtype():
    a, b = torch.randn(8, 16).bfloat16(), torch.randn(16, 4).bfloat16()
    with OpObserve("mm", report=None) as seen:  # below the cast: sees what actually runs
        with OpDtypeCast("mm", report=None) as cast:
            out = a @ b
            other = a + 1
    assert out.dtype == torch.bfloat16 and other.dtype == torch.bfloat16
    assert seen.records[0]["inputs"] == "f32[8,16] f32[16,4]"
    assert torch.equal(out, (a.float() @ b.float()).bfloat16())
    assert cast.counts == {"aten.mm.default": 1}


def test_dtype_cast_of_an_in_place_op_updates_the_original_tensor():
    x = torch.full((4, ), 1.0, dtype=torch.float16)
    y = torch.full((4, ), 1e-4, dtype=torch.float16)
    with OpDtypeCast("add_", casts={torch.float16: torch.float64}, report=None):
        result = x.add_(y)
    assert result is x and x.dtype == torch.float16
    assert torch.equal(x, torch.full((4, ), 1.0 + 1e-4, dtype=torch.float64).half())


def test_dtype_cast_of_an_out_variant_writes_the_out_tensor():
    a = torch.randn(3, 3).half()
    out = torch.empty(3, 3, dtype=torch.float16)
    with OpDtypeCast(patterns=r"mm\.out", report=None):
        returned = torch.mm(a, a, out=out)
    assert returned is out and torch.equal(out, (a.float() @ a.float()).half())


def test_parse_casts():
    assert parse_casts("bfloat16:float32, float16:float64") == {
        torch.bfloat16: torch.float32, torch.float16: torch.float64
    }
    with pytest.raises(ValueError, match="FROM:TO"):
        parse_casts("bfloat16")


def test_fallback_leaves_cpu_calls_unchanged():
    x = torch.randn(4, 4)
    with OpFallback(report=None) as fallback:
        y = x @ x
    assert torch.equal(y, x @ x) and fallback.counts == {}


def test_observe_logs_phase_module_shapes_and_dtypes(tmp_path):
    model, tokens = build_tiny(), tiny_batch(batch=2, seq=16)
    log = tmp_path / "ops.log"
    with OpObserve(["embedding", "embedding_dense_backward"], log_path=str(log), report=None) as observe:
        training_step(model, tokens)
    forward, backward = observe.records
    assert (forward["phase"], forward["module"]) == ("forward", "Transformer.embed")
    assert forward["inputs"] == "f32[256,64] i64[2,16]" and forward["outputs"] == "f32[2,16,64]"
    assert (backward["phase"], backward["module"]) == ("backward", "Transformer.embed")
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and "aten.embedding.default" in lines[0] and "-> f32[2,16,64]" in lines[0]
