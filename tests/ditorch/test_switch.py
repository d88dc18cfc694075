"""`import ditorch` as a user meets it, each case in a fresh interpreter."""

import json
import subprocess
import sys

import pytest


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_disable_leaves_torch_untouched():
    result = run_python(
        "import torch; z = torch.zeros; import ditorch; "
        "print(ditorch.vendor() is None, torch.zeros is z)", {"DITORCH_DISABLE": "1"})
    assert result.stdout.split() == ["True", "True"], result.stderr


def test_import_is_idempotent():
    result = run_python("import ditorch, torch; z = torch.zeros; v = ditorch.vendor(); "
                        "import importlib; ditorch.activate(); print(torch.zeros is z, ditorch.vendor() is v)")
    assert result.stdout.split() == ["True", "True"], result.stderr


def test_absent_vendors_report_why():
    result = run_python("import ditorch, json; print(json.dumps(ditorch.info()))")
    info = json.loads(result.stdout)
    assert info["adapters"]["npu"]["reason"] == "package torch_npu is not installed"
    assert info["adapters"]["cuda"]["available"] is False


def test_an_unknown_vendor_name_is_refused():
    result = run_python("import ditorch", {"DITORCH_VENDOR": "tpu"})
    assert result.returncode != 0 and "unknown ditorch vendor 'tpu'" in result.stderr


def test_use_switches_vendor_and_deactivate_restores_torch():
    result = run_python("import torch; z = torch.zeros; avail = torch.cuda.is_available\n"
                        "import ditorch\n"
                        "print(ditorch.vendor().name, torch.zeros(1, device='cuda').device.type)\n"
                        "ditorch.deactivate(); print(torch.zeros is z, torch.cuda.is_available is avail)\n"
                        "ditorch.use('dipu'); print(torch.randn(2, device='device').device.type)")
    assert result.stdout.split() == ["dipu", "dipu", "True", "True", "dipu"], result.stderr[-2000:]


def test_asking_for_an_absent_vendor_says_why():
    result = run_python("import ditorch; ditorch.use('npu')", {"DITORCH_DISABLE": "0"})
    assert "ditorch vendor 'npu' is not usable here: package torch_npu is not installed" in result.stderr


def test_backend_cuda_flags_are_accepted_harmlessly():
    result = run_python("import ditorch, torch; torch.backends.cuda.matmul.allow_tf32 = True; "
                        "torch.backends.cudnn.benchmark = True; print('ok')")
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


@pytest.mark.parametrize("variable, value, error", [
    ("DIPU_VENDOR", "nosuch", "DIPU_VENDOR: no DIPU vendor named 'nosuch' (installed: "),
    ("DIPU_FORCE_FALLBACK_OPS", "matmull", "DIPU_FORCE_FALLBACK_OPS: no ATen operator named 'matmull'"),
    ("DIPU_LOG_FALLBACK", "yes", "DIPU_LOG_FALLBACK='yes': expected 0 or 1"),
    ("DITORCH_DISABLE", "maybe", "DITORCH_DISABLE='maybe': expected 0 or 1"),
], ids=["vendor", "fallback_ops", "log_fallback", "disable"])
def test_a_bad_setting_stops_the_import_naming_it_instead_of_leaving_the_script_without_a_device(
        variable, value, error):
    # Detection used to count a dipu shim that failed on such a setting as absent: the script then ran
    # on no accelerator at all (torch.cuda.is_available() False) without a word.
    result = run_python("import ditorch; print(ditorch.vendor())", {variable: value})
    assert result.returncode != 0, result.stdout
    assert error in result.stderr.strip().splitlines()[-1], result.stderr[-1000:]


def test_a_bad_setting_is_one_line_and_exit_2_for_a_command(cli, tmp_path):
    result = cli("h2.cli.main", "train", "--device", "dipu", "--steps", "1", "--out", str(tmp_path / "run"),
                 env={"DIPU_VENDOR": "nosuch"})
    assert result.returncode == 2
    assert result.stderr.strip() == "h2: error: DIPU_VENDOR: no DIPU vendor named 'nosuch' (installed: host, opencl)"
