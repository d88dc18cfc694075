"""Op tools switched on from environment variables, for scripts that are not modified."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

SCRIPT = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
layer = torch.nn.Linear(8, 4)
x = torch.randn(5, 8, requires_grad=True)
loss = F.log_softmax(layer(x), dim=-1).sum()
loss.backward()
print("loss", loss.item())
"""


def run_script(tmp_path, env: dict, *, via_runner: bool, import_ditorch: bool = False):
    script = tmp_path / "train.py"
    script.write_text(("import ditorch\n" if import_ditorch else "") + SCRIPT)
    command = [sys.executable, "-m", "ditorch.op_tools.run", str(script)
               ] if via_runner else [sys.executable, str(script)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DITORCH_")}
    return subprocess.run(command, cwd=tmp_path, env={**clean, "OMP_NUM_THREADS": "1", **env}, capture_output=True,
                          text=True, timeout=120)


def test_autocompare_from_environment_on_import_ditorch(tmp_path):
    result = run_script(tmp_path, {"DITORCH_AUTOCOMPARE": "1", "DITORCH_OP_FILTER": "addmm,mm"}, via_runner=False,
                        import_ditorch=True)
    assert result.returncode == 0, result.stderr
    (csv_file, ) = (tmp_path / "ditorch_op_tools").glob("autocompare_*.csv")
    rows = list(csv.DictReader(open(csv_file)))
    assert {(r["op"], r["phase"]) for r in rows} == {("aten.addmm.default", "forward"), ("aten.mm.default", "backward")}
    assert len(rows) == 3 and all(r["module"] == "Linear" for r in rows)
    assert "autocompare: 3 op calls compared with cpu, 0 beyond tolerance" in result.stderr


def test_runner_inspects_an_unmodified_script(tmp_path):
    out_dir = tmp_path / "tools"
    result = run_script(
        tmp_path, {
            "DITORCH_OP_OBSERVE": "1", "DITORCH_OP_TIME": "1", "DITORCH_OP_EXCLUDE": "t",
            "DITORCH_OP_TIME_OP_FILTER": "_log_softmax", "DITORCH_OP_TOOLS_DIR": str(out_dir)
        }, via_runner=True)
    assert result.returncode == 0, result.stderr
    assert "loss" in result.stdout
    (log, ) = out_dir.glob("op_observe_*.log")
    logged = log.read_text()
    assert "aten.addmm.default" in logged and " aten.t.default " not in logged
    (times, ) = out_dir.glob("op_time_*.csv")
    assert {row["op"] for row in csv.DictReader(open(times))} == {"aten._log_softmax.default"}


def test_overflow_check_from_environment_names_the_origin(tmp_path):
    script = tmp_path / "overflow.py"
    script.write_text("import torch\nx = torch.tensor([100.0])\ny = x.exp() * 2\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DITORCH_")}
    result = subprocess.run([sys.executable, "-m", "ditorch.op_tools.run",
                             str(script)], cwd=tmp_path, env={**clean, "DITORCH_OVERFLOW_CHECK": "1"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "aten.exp.default (forward) in <no module> produced inf" in result.stderr


def test_import_ditorch_without_variables_hooks_nothing(tmp_path):
    check = ("import ditorch, sys\n"
             "import torch\nfrom torch.nn.modules import module as m\n"
             "from torch.utils._python_dispatch import _get_current_dispatch_mode\n"
             "assert not m._global_forward_pre_hooks and not m._global_forward_hooks\n"
             "assert _get_current_dispatch_mode() is None\nprint('clean')\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DITORCH_")}
    result = subprocess.run([sys.executable, "-c", check], env={**clean, "DITORCH_AUTOCOMPARE": "0"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "clean" in result.stdout, result.stderr
