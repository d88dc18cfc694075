"""`ditorch conformance` and `ditorch info` as a user runs them."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ditorch.dipu import conformance, diopi_table
from ditorch.dipu.conformance import Check, CheckResult, run_conformance
from h2.cli.ditorch import main

QUICK = ["--max-samples", "1", "--dtypes", "float32"]


def ditorch(*args, **env):
    command = [sys.executable, "-c", "import sys; from h2.cli.ditorch import main; sys.exit(main())", *args]
    return subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def table_check_count() -> int:
    return len(conformance.table_checks(diopi_table()))


def test_every_table_check_conforms_under_the_default_profile(capsys):
    assert main(["conformance", *QUICK]) == 0
    n = table_check_count()
    assert f"summary: {n} passed, 0 failed of {n} table checks" in capsys.readouterr().out


def test_reduced_precision_profile_fails_exactly_the_entries_whose_diopi_function_it_rounds(tmp_path):
    rounded = conformance.profile_degradation("lowprec").functions
    expected = {entry.aten for entry in diopi_table() if entry.diopi in rounded}
    report = tmp_path / "lowprec.json"
    result = ditorch("conformance", "--profile", "lowprec", *QUICK, "--json", str(report))
    assert result.returncode == 1, result.stderr
    failed = {r["aten"] for r in json.loads(report.read_text())["results"] if r["status"] == "fail"}
    assert expected and failed == expected


def test_reduced_precision_failures_are_explained_by_the_profile_in_the_markdown(tmp_path):
    table = tmp_path / "lowprec.md"
    ditorch("conformance", "--profile", "lowprec", "--ops", "mm,add", *QUICK, "--markdown", str(table))
    rows = {line.split("|")[1].strip(): line for line in table.read_text().splitlines() if line.startswith("| `")}
    assert "rounds diopiAddmm, diopiBmm, diopiMm outputs to 10 mantissa bits" in rows["`mm`"]
    assert rows["`add.Tensor`"].endswith("| 1 | 1 |  |")


def saved_run(path, profile, failing: dict) -> str:
    """A --json file whose checks `failing` maps to their degraded flag."""
    results = [
        CheckResult(Check(name, "forward"), {"float32": conformance.DtypeResult(0, 1, "differs")}, fallback_calls=1,
                    degraded=degraded).to_dict() for name, degraded in failing.items()
    ]
    path.write_text(
        json.dumps({
            "vendor": "host", "profile": profile, "degrades": ["diopiMm"] if profile == "lowprec" else [],
            "results": results
        }))
    return str(path)


def test_the_profile_verdict_leaves_out_the_checks_the_baseline_fails_too(tmp_path, capsys):
    baseline = saved_run(tmp_path / "default.json", "default", {"conv2d": False})
    lowprec = saved_run(tmp_path / "lowprec.json", "lowprec", {"conv2d": False, "matmul": True})
    main(["conformance", "--from-json", lowprec, "--baseline", baseline])
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(
        "1 checks reach them; exactly the degraded checks fail (of the checks the baseline passes; it fails 1)")


def test_a_saved_run_is_reported_again_without_running(tmp_path, capsys):
    saved = tmp_path / "run.json"
    assert main(["conformance", "--ops", "mm,add", *QUICK, "--json", str(saved)]) == 0
    first = capsys.readouterr().out.splitlines()
    assert main(["conformance", "--from-json", str(saved)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == first[1:]


def test_fallback_sweep_records_the_path_each_op_took():
    results = conformance.run_isolated([Check("cumsum", "forward"), Check("mm", "forward")], dtypes=(torch.float32, ),
                                       max_samples=1)
    assert [(r.check.opinfo, r.path, r.status) for r in results] == [("cumsum", "fallback", "pass"),
                                                                     ("mm", "diopi", "pass")]


def test_lowprec_fallback_sweep_fails_exactly_the_ops_that_reach_a_rounded_kernel(tmp_path):
    report = tmp_path / "sweep.json"
    ditorch("conformance", "--profile", "lowprec", "--fallback", "--ops", "matmul,einsum,cumsum,tanh,cholesky_solve",
            "--max-samples", "3", "--dtypes", "float32", "--json", str(report))
    results = [r for r in json.loads(report.read_text())["results"] if r["aten"] is None]
    failed = {(r["opinfo"], r["mode"]) for r in results if r["status"] == "fail"}
    degraded = {(r["opinfo"], r["mode"]) for r in results if r["degraded"]}
    assert ("matmul", "forward") in degraded and ("cumsum", "forward") not in degraded
    assert failed == degraded


def test_a_rounded_kernel_that_a_cpp_kernel_calls_degrades_the_check(tmp_path):
    report = tmp_path / "bilinear.json"  # bilinear's bmm is called inside _trilinear, unseen by Python
    ditorch("conformance", "--profile", "lowprec", "--fallback", "--ops", "nn.functional.bilinear", "--max-samples",
            "3", "--dtypes", "float32", "--json", str(report))
    results = {(r["opinfo"], r["mode"]): r for r in json.loads(report.read_text())["results"]}
    forward = results[("nn.functional.bilinear", "forward")]
    assert (forward["status"], forward["degraded"]) == ("fail", True)


CRASHING_WORKER = """
import json, os, signal, sys
job = json.loads(sys.stdin.read())
for opinfo, mode, aten, diopi in job["checks"]:
    if opinfo == "crashes":
        os.kill(os.getpid(), signal.SIGSEGV)
    if opinfo == "hangs":
        signal.pause()
    print(json.dumps({"opinfo": opinfo, "mode": mode, "aten": aten, "diopi": diopi, "dtypes": {"float32":
          {"passed": 1, "failed": 0, "first_failure": ""}}, "diopi_calls": 0, "fallback_calls": 1,
          "degraded": False, "not_compared": "", "declared": "", "error": ""}), flush=True)
"""


def test_a_check_that_kills_its_worker_fails_with_the_signal_and_the_sweep_goes_on():
    checks = [Check("first", "forward"), Check("crashes", "forward"), Check("last", "forward")]
    results = conformance.run_isolated(checks, worker=(sys.executable, "-c", CRASHING_WORKER))
    assert [(r.check.opinfo, r.status, r.error)
            for r in results] == [("first", "pass", ""), ("crashes", "fail", "crashed the process (SIGSEGV)"),
                                  ("last", "pass", "")]


def test_a_check_that_outlasts_the_timeout_fails_and_the_sweep_goes_on():
    checks = [Check("hangs", "forward"), Check("last", "forward")]
    results = conformance.run_isolated(checks, worker=(sys.executable, "-c", CRASHING_WORKER), timeout=3)
    assert [(r.check.opinfo, r.status, r.error) for r in results] == [("hangs", "fail", "ran longer than 3 s"),
                                                                      ("last", "pass", "")]


def test_conformance_can_select_operators_and_dtypes():
    results = run_conformance(ops=["mm", "softmax"], dtypes=(torch.float64, ), max_samples=2)
    assert [(r.check.aten, r.check.label, r.passed)
            for r in results] == [("mm", "mm", True), ("_softmax", "softmax", True),
                                  ("_softmax_backward_data", "softmax:backward", True)]
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
    (["conformance", "--fallback", "--ops", "nosuchop"
      ], "ditorch: error: no DIOPI table entry or OpInfo matches nosuchop"),
    (["conformance", "--max-samples", "0"], "ditorch: error: --max-samples must be between 1 and 10000, got 0"),
    (["conformance", "--from-json", "/nonexistent/run.json"], "ditorch: error: /nonexistent/run.json: cannot read"),
    (["conformance", "--check-timeout", "0"], "ditorch: error: --check-timeout must be a positive number of seconds"),
    (["conformance", "--ops", "mm", "--json", "/nonexistent/r.json", "--max-samples", "1", "--dtypes", "float32"
      ], "ditorch: error: /nonexistent/r.json: cannot write"),
    (["frobnicate"], "ditorch: error: argument command: invalid choice"),
])
def test_cli_usage_errors_are_one_line_with_exit_status_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err


@pytest.mark.parametrize("args, message", [
    (["conformance", "--vendor", "nosuch"], "ditorch: error: no DIPU vendor named 'nosuch' (installed: host, opencl)"),
    (["info"], "dipu: not loadable (DIPU vendor host failed to start: "
     "DIPU_HOST_PROFILE: no built-in profile named 'nosuch'")
])
def test_vendor_and_profile_problems_are_reported_in_one_line(args, message):
    result = ditorch(*args, DIPU_HOST_PROFILE="nosuch")
    assert "Traceback" not in result.stderr
    if args[0] == "info":
        assert result.returncode == 0 and message in result.stdout
    else:
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith(message)


def test_conformance_with_no_samples_is_a_flag_error_not_a_vendor_failure():
    result = ditorch("conformance", "--max-samples", "0")
    assert result.returncode == 2 and last_line(
        result.stderr) == "ditorch: error: --max-samples must be between 1 and 10000, got 0"
