"""`ditorch conformance` and `ditorch info` as a user runs them."""
import os
import subprocess
import sys

import pytest

from h2.cli.ditorch import main
from ditorch.dipu.conformance import run_conformance

import torch

QUICK = ["--max-samples", "1", "--dtypes", "float32"]


def ditorch(*args, **env):
    command = [sys.executable, "-c", "import sys; from h2.cli.ditorch import main; sys.exit(main())", *args]
    return subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_every_table_entry_conforms_under_the_default_profile(capsys):
    assert main(["conformance", *QUICK]) == 0
    assert last_line(capsys.readouterr().out) == "summary: 69 passed, 0 failed of 69 table entries"


def test_reduced_precision_profile_fails_exactly_the_matmul_entries():
    result = ditorch("conformance", "--profile", "lowprec", *QUICK)
    assert result.returncode == 1, result.stderr
    assert last_line(result.stdout) == "summary: 66 passed, 3 failed of 69 table entries; failed: mm, bmm, addmm"
    assert "Mismatched elements" in result.stdout


def test_conformance_can_select_operators_and_dtypes():
    results = run_conformance(ops=["mm", "softmax"], dtypes=(torch.float64,), max_samples=2)
    assert [(r.entry.aten, r.check, r.passed) for r in results] == [
        ("mm", "mm", True), ("_softmax", "softmax", True), ("_softmax_backward_data", "softmax:backward", True)]
    assert all(list(r.dtypes) == ["float64"] for r in results)


def test_info_lists_the_dipu_vendor_and_devices():
    result = ditorch("info", DIPU_HOST_PROFILE="small")
    assert result.returncode == 0, result.stderr
    assert "vendor: dipu" in result.stdout
    assert "dipu: vendor host" in result.stdout
    assert "dipu:0 host-emulated (small): 0.25 GiB, not host-accessible, relative speed 0.5" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["conformance", "--dtypes", "float33"], "ditorch: error: --dtypes: 'float33' is not a torch dtype"),
    (["conformance", "--ops", "nosuchop"], "ditorch: error: no DIOPI table entry matches nosuchop"),
    (["frobnicate"], "ditorch: error: argument command: invalid choice"),
])
def test_cli_usage_errors_are_one_line_with_exit_status_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err


@pytest.mark.parametrize("args, message", [
    (["conformance", "--vendor", "nosuch"], "ditorch: error: no DIPU vendor named 'nosuch' (installed: host)"),
    (["info"], "dipu: not loadable (DIPU vendor host failed to start: DIPU_HOST_PROFILE: no built-in profile named 'nosuch'"),
])
def test_vendor_and_profile_problems_are_reported_in_one_line(args, message):
    result = ditorch(*args, DIPU_HOST_PROFILE="nosuch")
    assert "Traceback" not in result.stderr
    if args[0] == "info":
        assert result.returncode == 0 and message in result.stdout
    else:
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith(message)
