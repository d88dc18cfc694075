"""`ditorch compat`: each probe runs as a CUDA user writes it, after `import ditorch`, in its own
process; the report says "works" or the first line of the error the user sees."""

import textwrap

import pytest

from ditorch.compat import PROBES, run_probes
from h2.cli.ditorch import main as ditorch


def probe_result(code: str):
    (result, ) = run_probes([("test", "probe", code)])
    return result


def test_a_probe_runs_after_import_ditorch_so_cuda_names_the_vendor_device():
    result = probe_result('result = str(torch.ones(1, device="cuda").device)')
    assert (result.works, result.detail) == (True, "dipu:0")


def test_a_failing_probe_reports_the_error_type_and_first_line():
    result = probe_result('raise ValueError("expected a dipu device, got cuda:0\\nsecond line")')
    assert (result.works, result.detail) == (False, "ValueError: expected a dipu device, got cuda:0")


def test_a_probe_that_kills_its_process_is_reported_as_died():
    result = probe_result("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert not result.works and result.detail.startswith("the process died")


def test_every_probe_has_an_area_a_name_and_code_that_compiles():
    for area, api, code in PROBES:
        compile(textwrap.dedent(code), api, "exec")
        assert area and api


@pytest.mark.parametrize("args, message", [
    (["compat", "--area", "nosuch"], "ditorch: error: --area: no probes in 'nosuch'"),
    (["compat", "--markdown", "/nonexistent/compat.md"], "ditorch: error: /nonexistent/compat.md: cannot write"),
])
def test_compat_usage_errors_are_one_line_with_exit_status_2(args, message, capsys):
    assert ditorch(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err
