"""Autocompare: each selected op is rerun on a CPU reference and compared, forward and backward."""

from __future__ import annotations

import csv

import pytest
import torch

from conftest import Perturb, build_tiny, tiny_batch, training_step
from ditorch.op_tools import OpAutoCompare, Tolerances
from ditorch.op_tools.autocompare import CSV_FIELDS


def mismatched(tool: OpAutoCompare) -> set[tuple[str, str, str]]:
    return {(row["op"], row["phase"], row["module"]) for row in tool.mismatches}


def test_unchanged_training_step_on_cpu_has_no_mismatch_and_covers_both_phases(tmp_path):
    model, tokens = build_tiny(), tiny_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with OpAutoCompare(csv_path=str(tmp_path / "ac.csv"), report=None) as tool:
        training_step(model, tokens, optimizer)
    assert tool.mismatches == []
    phases = {row["phase"] for row in tool.rows}
    assert phases == {"forward", "backward"}
    ops = {row["op"] for row in tool.rows}
    assert {"aten.mm.default", "aten.embedding_dense_backward.default"} <= ops
    assert "aten.addcdiv_.default" in ops, "the optimizer update was not compared"
    assert all(row["status"] == "ok" for row in tool.rows), [r for r in tool.rows if r["status"] != "ok"][:3]


def compare_with_mm_changed_in(target: str, phase: str) -> tuple[Perturb, OpAutoCompare]:
    """A training step under autocompare in which the chip changes mm's result in one module and phase."""
    model, tokens = build_tiny(), tiny_batch()
    with Perturb("mm", predicate=lambda call: call.module == target and call.phase == phase) as chip:
        with OpAutoCompare(report=None) as tool:
            training_step(model, tokens)
    return chip, tool


def test_changed_op_in_one_module_is_the_only_flag_and_the_first_mismatch():
    target = "Transformer.layers.1.mlp.up_proj"
    chip, tool = compare_with_mm_changed_in(target, "forward")
    assert chip.calls == 1
    assert mismatched(tool) == {("aten.mm.default", "forward", target)}
    first = tool.first_mismatch
    assert first["module"] == target and first["max_rel"] == pytest.approx(1e-3, rel=1e-3)
    assert "first: call" in tool.summary() and target in tool.summary()


def test_changed_backward_op_is_reported_with_its_module_path():
    target = "Transformer.layers.0.attn.o_proj"
    chip, tool = compare_with_mm_changed_in(target, "backward")
    assert chip.calls == 2  # gradient of the input and of the weight
    assert mismatched(tool) == {("aten.mm.default", "backward", target)}


def test_csv_has_one_row_per_compared_call(tmp_path):
    model, tokens = build_tiny(), tiny_batch()
    path = tmp_path / "out" / "ac.csv"
    with OpAutoCompare(["mm", "_log_softmax"], csv_path=str(path), report=None) as tool:
        training_step(model, tokens)
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == CSV_FIELDS
    assert len(rows) == len(tool.rows) > 0
    assert {row["op"] for row in rows} == {"aten.mm.default", "aten._log_softmax.default"}
    assert all(row["allclose"] == "True" for row in rows)


def test_per_op_tolerance_override_accepts_a_known_difference():
    model, tokens = build_tiny(), tiny_batch()
    loose = Tolerances(per_op={"mm": {torch.float32: (5e-3, 1e-5)}})
    with Perturb("mm", relative=1e-3):
        with OpAutoCompare(tolerances=loose, report=None) as tool:
            training_step(model, tokens)
    assert tool.mismatches == []
    assert {row["rtol"] for row in tool.rows if row["op"] == "aten.mm.default"} == {5e-3}


def test_per_dtype_tolerance_override():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    with Perturb("mm", relative=1e-3):
        with OpAutoCompare(tolerances=Tolerances(per_dtype={torch.float32: (1e-2, 1e-5)}), report=None) as tool:
            x @ w
    assert tool.rows[0]["status"] == "ok" and tool.rows[0]["rtol"] == 1e-2


def test_half_precision_matmul_is_referenced_in_float32():
    a, b = torch.randn(16, 32).bfloat16(), torch.randn(32, 8).bfloat16()
    with OpAutoCompare("mm", report=None) as tool:
        a @ b
    (row, ) = tool.rows
    assert row["reference"] == "cpu bfloat16->float32"
    assert row["status"] == "ok" and row["max_abs"] > 0  # bf16 rounding, within bf16 tolerance


def test_in_place_op_is_compared_against_its_inputs_before_the_call():
    x, y = torch.randn(5), torch.randn(5)
    with OpAutoCompare("add_", report=None) as tool:
        x.add_(y)
    assert [row["status"] for row in tool.rows] == ["ok"]


def test_random_and_view_ops_are_not_compared():
    x = torch.randn(4, 4)
    with OpAutoCompare(report=None) as tool:
        torch.nn.functional.dropout(x, 0.5, training=True)
        x.view(16)
    assert all("dropout" not in row["op"] and "bernoulli" not in row["op"] for row in tool.rows)
    assert "aten.view.default" not in {row["op"] for row in tool.rows}


def test_raise_on_mismatch_stops_at_the_first_changed_op():
    with Perturb("mm"):
        with OpAutoCompare(raise_on_mismatch=True, report=None):
            with pytest.raises(AssertionError, match=r"aten\.mm\.default \(forward\)"):
                torch.randn(4, 4) @ torch.randn(4, 4)


def test_in_place_op_returning_nothing_is_compared_on_what_it_wrote():
    params, grads = [torch.randn(4), torch.randn(3)], [torch.randn(4), torch.randn(3)]
    with OpAutoCompare("_foreach_add_", report=None) as tool:
        torch._foreach_add_(params, grads)
    (row, ) = tool.rows
    assert row["status"] == "ok" and row["outputs"] == ""
