"""Operator routing: DIOPI table entries run on the device, everything else through the CPU
fallback, which is counted, can be logged, and can be forced per operator."""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import ditorch.dipu as dipu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_counts():
    dipu.force_fallback([])
    dipu.reset_fallback_counts()
    yield
    dipu.force_fallback([])


def test_table_operators_run_on_the_device():
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    result = torch.softmax(x.dipu() @ w.dipu() + 1.0, dim=-1)
    assert torch.equal(result.cpu(), torch.softmax(x @ w + 1.0, dim=-1))
    assert dipu.fallback_counts() == {}


def test_an_operator_outside_the_table_falls_back_and_is_counted():
    x = torch.randn(4, 5)
    assert torch.equal(torch.cumsum(x.dipu(), dim=1).cpu(), torch.cumsum(x, dim=1))
    assert dipu.fallback_counts() == {"aten::cumsum.out": 1} or dipu.fallback_counts() == {"aten::cumsum": 1}


def test_forced_fallback_sends_a_table_operator_to_the_cpu():
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    dipu.force_fallback(["mm"])
    assert torch.equal((x.dipu() @ w.dipu()).cpu(), x @ w)
    assert dipu.fallback_counts() == {"aten::mm": 1}
    dipu.force_fallback([])
    x.dipu() @ w.dipu()
    assert dipu.fallback_counts() == {"aten::mm": 1}


def test_copies_views_resizes_and_allocation_are_native():
    x = torch.randn(4, 6)
    d = torch.empty(0, device="dipu")
    d.resize_(4, 6)
    d.copy_(x)
    strided = d.t()[1:3]
    checks = [
        torch.equal(strided.contiguous().cpu(),
                    x.t()[1:3].contiguous()),
        torch.equal(d.view(24).cpu(), x.view(24)),
        torch.equal(d.to(torch.float64).cpu(), x.double()),
        torch.equal(d.unfold(1, 2, 2).cpu(), x.unfold(1, 2, 2)),
        float(d[2, 3]) == float(x[2, 3]),
    ]
    assert all(checks)
    assert dipu.fallback_counts() == {}


def test_fallbacks_are_logged_with_their_reason(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch, ditorch.dipu
        x = torch.randn(3, 3, device="dipu")
        torch.cumsum(x, 0); x @ x
    """, DIPU_LOG_FALLBACK="1", DIPU_FORCE_FALLBACK_OPS="mm")
    assert result.returncode == 0, result.stderr
    assert "[dipu] CPU fallback: aten::cumsum.out (not in the DIOPI table)" in result.stderr
    assert "[dipu] CPU fallback: aten::mm (forced by DIPU_FORCE_FALLBACK_OPS)" in result.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the test vendor")
def test_a_vendor_built_separately_loads_at_run_time_and_falls_back_for_missing_kernels(tmp_path, python_in_subprocess):
    library = tmp_path / "libdipu_vendor_minimal.so"
    subprocess.run([
        "cc", "-shared", "-fPIC", "-O1", f"-I{REPO / 'csrc/dipu/vendor'}",
        str(Path(__file__).with_name("minimal_vendor.c")), "-o",
        str(library)
    ], check=True)
    result = python_in_subprocess(
        """
        import torch, ditorch.dipu as dipu
        x, w = torch.randn(3, 4), torch.randn(4, 2)
        y = (x.dipu() @ w.dipu()).cpu()
        print(dipu.vendor_name(), torch.dipu.device_count(), torch.equal(y, x @ w), dipu.fallback_counts())
    """, DIPU_VENDOR=str(library))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "minimal 1 True {'aten::mm': 1}"


def test_an_unknown_operator_in_dipu_force_fallback_ops_stops_the_import_naming_it(python_in_subprocess):
    result = python_in_subprocess("import ditorch.dipu", DIPU_FORCE_FALLBACK_OPS="mm, matmull,add.Tensr")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].endswith(
        "DIPU_FORCE_FALLBACK_OPS: no ATen operator named 'matmull', 'add.Tensr' "
        "(expected names such as 'mm' (every overload) or 'add.Tensor')")


def test_force_fallback_refuses_an_unknown_operator_and_keeps_its_list():
    dipu.force_fallback(["mm", "add.Tensor"])
    with pytest.raises(dipu.DipuError, match=r"^force_fallback: no ATen operator named 'nope'"):
        dipu.force_fallback(["nope"])
    assert dipu.forced_fallback() == ["mm", "add.Tensor"]
