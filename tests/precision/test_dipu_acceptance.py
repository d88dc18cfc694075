"""Acceptance on the dipu device (host vendor): on the reduced-precision `lowprec` profile
(matmul outputs rounded to 10 mantissa bits) autocompare flags the matmul and nothing else in a
full training step of the tiny model; module compare names the first matmul module; captured calls
replay on the CPU with a mismatch; overflow, fallback and timing work on the device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import build_tiny, tiny_batch, training_step

dipu = pytest.importorskip("ditorch.dipu", reason="the dipu extension is not built")

LOWPREC_STEP = """
import json, sys, torch
torch.set_num_threads(1)
import ditorch.dipu
sys.path.insert(0, {tests!r})
from conftest import build_tiny, tiny_batch, training_step
from ditorch.op_tools import OpAutoCompare, OpCapture
from ditorch.precision.module_compare import compare_module_step
from h2.model.transformer import language_model_loss

model = build_tiny().to("dipu")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = tiny_batch().to("dipu")
with OpCapture({capture!r}, "mm", max_calls=3, report=None):
    with OpAutoCompare(report=None) as tool:
        training_step(model, tokens, optimizer)
tokens = tiny_batch()
report = compare_module_step(build_tiny(), (tokens[:, :-1],), targets=tokens[:, 1:], loss_fn=language_model_loss,
                             candidate_device="dipu")
first = report.first_divergence
print(json.dumps({{"flagged": sorted({{row["op"] for row in tool.mismatches}}),
                  "phases": sorted({{row["phase"] for row in tool.mismatches}}),
                  "first_module": tool.first_mismatch["module"],
                  "ops_compared": sorted({{row["op"] for row in tool.rows}}),
                  "module_first": [first.module, first.kind]}}))
"""


@pytest.fixture(scope="module")
def lowprec_run(tmp_path_factory):
    capture = str(tmp_path_factory.mktemp("lowprec") / "capture")
    code = LOWPREC_STEP.format(tests=os.path.dirname(os.path.abspath(__file__)), capture=capture)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "DIPU_HOST_PROFILE": "lowprec", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), capture


def test_autocompare_flags_the_changed_op_and_nothing_else_on_lowprec(lowprec_run):
    result, _ = lowprec_run
    assert result["flagged"] == ["aten.mm.default"]
    assert result["phases"] == ["backward", "forward"]
    assert result["first_module"] == "Transformer.layers.0.attn.q_proj"
    compared = set(result["ops_compared"])
    assert {
        "aten._scaled_dot_product_flash_attention_for_cpu.default", "aten._log_softmax.default",
        "aten.embedding_dense_backward.default"
    } <= compared
    assert any(op.startswith("aten._foreach_") for op in compared), "the AdamW update was not compared"


def test_module_compare_names_the_first_matmul_module_on_lowprec(lowprec_run):
    result, _ = lowprec_run
    assert result["module_first"] == ["Transformer.layers.0.attn.q_proj", "output"]


def test_calls_captured_on_lowprec_replay_with_a_mismatch_on_the_cpu(lowprec_run, cli, capsys):
    from h2.cli.ditorch import main as ditorch

    _, capture = lowprec_run
    assert ditorch(["replay", capture, "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "replayed 3 op calls on cpu" in out
    on_lowprec = cli("h2.cli.ditorch", "replay", capture, "--device", "dipu", env={"DIPU_HOST_PROFILE": "lowprec"})
    assert on_lowprec.returncode == 0, on_lowprec.stdout + on_lowprec.stderr


def test_default_profile_training_step_is_identical_to_the_cpu():
    from ditorch.op_tools import OpAutoCompare

    model = build_tiny().to("dipu")
    with OpAutoCompare(report=None) as tool:
        training_step(model, tiny_batch().to("dipu"), torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert tool.mismatches == [] and len(tool.rows) > 300


def test_overflow_check_names_the_injected_overflow_on_dipu():
    from ditorch.op_tools import OpOverflowCheck

    model = build_tiny().to("dipu")
    with torch.no_grad():
        model.layers[2].mlp.up_proj.weight.fill_(1e38)
    with OpOverflowCheck(report=None) as check:
        training_step(model, tiny_batch().to("dipu"))
    assert (check.first.op, check.first.module) == ("aten.mm.default", "Transformer.layers.2.mlp.up_proj")
    assert check.first.output_stats["device"].startswith("dipu")


def test_fallback_runs_selected_ops_on_the_cpu_and_returns_device_tensors():
    from ditorch.op_tools import OpFallback, OpObserve

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    x, y = torch.randn(5), torch.randn(5)
    xd = x.to("dipu")
    with OpObserve(["mm", "add_"], report=None) as seen:
        with OpFallback(["mm", "add_"], report=None) as fallback:
            product = a.to("dipu") @ b.to("dipu")
            returned = xd.add_(y.to("dipu"))
    assert product.device.type == "dipu" and torch.equal(product.cpu(), a @ b)
    assert returned is xd and torch.equal(xd.cpu(), x + y)
    assert [(r["op"], r["device"]) for r in seen.records] == [("aten.mm.default", "cpu"), ("aten.add_.Tensor", "cpu")]
    assert fallback.counts == {"aten.mm.default": 1, "aten.add_.Tensor": 1}


def test_time_measure_synchronises_and_names_the_device():
    from ditorch.op_tools import OpTimeMeasure

    with OpTimeMeasure("mm", report=None) as timer:
        torch.randn(16, 16).to("dipu") @ torch.randn(16, 16).to("dipu")
    (row, ) = timer.rows
    assert row["device"].startswith("dipu") and row["time_ms"] > 0
