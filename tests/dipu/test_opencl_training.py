"""Training on the OpenCL vendor against the CPU (issue 33's acceptance): 20 AdamW steps of a
TransformerEncoderLayer and of the project's model, with every loss within 1e-4 relative of the CPU's,
and the heavy operators on OpenCL (only attention, which the vendor does not implement, falls back).
Each run is tests/dipu/opencl_training.py in a process whose DIPU_VENDOR is opencl."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_opencl_vendor import warm_opencl_caches  # noqa: F401  (compiles the kernels outside the timed tests)

HERE = Path(__file__).resolve().parent
ATTENTION = {
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
}


def train(which: str, steps: int = 20, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(HERE / "opencl_training.py"), which,
         str(steps), *extra], capture_output=True, text=True, timeout=900, env={**os.environ, "DIPU_VENDOR": "opencl"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["vendor"] == "opencl"
    return report


def relative_errors(report: dict) -> list[float]:
    return [abs(d - c) / abs(c) for c, d in zip(report["cpu"], report["dipu"])]


@pytest.mark.parametrize("which", ["encoder", "tiny"])
def test_twenty_adamw_steps_on_opencl_stay_within_1e4_of_the_cpu(which):
    report = train(which)
    assert len(report["dipu"]) == 20 and report["cpu"][-1] < report["cpu"][0]
    assert max(relative_errors(report)) < 1e-4, relative_errors(report)
    assert set(report["fallbacks"]) <= ATTENTION, report["fallbacks"]


@pytest.mark.slow
def test_the_small_model_trains_twenty_adamw_steps_on_opencl_within_1e4_of_the_cpu():
    """At lr 3e-4 (at 1e-3 the memorised batch's loss falls to 1.4 in 20 steps and float32 rounding
    differences grow past 1e-4 by step 13: measured 1.0e-3, docs/opencl.md)."""
    report = train("small", 20, "3e-4")
    assert report["cpu"][-1] < report["cpu"][0] / 2
    assert max(relative_errors(report)) < 1e-4, relative_errors(report)
    assert set(report["fallbacks"]) <= ATTENTION, report["fallbacks"]


@pytest.mark.slow
def test_at_lr_1e3_the_small_models_cpu_losses_move_past_1e4_with_more_accurate_gemms_alone():
    """The float32 rounding floor behind the acceptance's 1e-4 (docs/opencl.md): the CPU run against itself
    with every linear layer's GEMMs computed in float64 and rounded to float32. At lr 1e-3 (measured 8.4e-4)
    it is past 1e-4, as OpenCL is (1.0e-3); at lr 3e-4 both stay inside it."""
    result = subprocess.run([sys.executable,
                             str(HERE / "opencl_training.py"), "floor", "small", "20", "1e-3"], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    errors = relative_errors({"cpu": report["cpu"], "dipu": report["cpu_float64_gemms"]})
    assert report["cpu"][-1] < report["cpu"][0] / 2
    assert errors[0] < 1e-6 and max(errors) > 1e-4, errors
