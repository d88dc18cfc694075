"""`import ditorch` as a user meets it, each case in a fresh interpreter."""

import json
import subprocess
import sys


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_disable_leaves_torch_untouched():
    result = run_python("import torch; z = torch.zeros; import ditorch; "
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
