"""The no-edit path: `python -m ditorch script.py` and `ditorch run script.py` run a CUDA-written script
as `python script.py` would (its folder on sys.path, its arguments), on the vendor's device, and the
Python processes it starts (spawned children, torchrun workers) get the mapping too. Scripts that begin
with `from __future__ import ...` need no edit at all this way."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = """\
from __future__ import annotations

import sys

import torch
import torch.multiprocessing as mp

from helper import describe


def child(queue) -> None:
    queue.put(torch.zeros(1, device="cuda").device.type)


if __name__ == "__main__":
    print(describe(torch.ones(2, device="cuda")), *sys.argv[1:])
    if "--spawn" in sys.argv:
        context = mp.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        print("child", queue.get(timeout=120))
        process.join()
        sys.exit(process.exitcode)
"""


@pytest.fixture
def script(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "helper.py").write_text("def describe(tensor):\n    return tensor.device.type\n")
    (folder / "train.py").write_text(SCRIPT)
    return folder / "train.py"


def launch(*command, cwd):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_python_m_ditorch_runs_the_script_from_another_folder_with_its_sibling_modules(script, tmp_path):
    result = launch(sys.executable, "-m", "ditorch", str(script), "--lr", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["dipu", "--lr", "3"]


def test_ditorch_run_is_the_same_launcher(script, tmp_path):
    result = launch(sys.executable, "-m", "h2.cli.ditorch", "run", str(script), "--lr", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["dipu", "--lr", "3"]


def test_processes_the_script_spawns_get_the_mapping_too(script, tmp_path):
    result = launch(sys.executable, "-m", "ditorch", str(script), "--spawn", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-2:] == ["child", "dipu"]


def test_a_script_that_does_not_exist_is_one_line_and_exit_status_2(tmp_path):
    result = launch(sys.executable, "-m", "ditorch", "missing.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "python -m ditorch: cannot open script missing.py: no such file"


def test_import_ditorch_right_after_the_future_imports_is_enough(tmp_path):
    script = tmp_path / "direct.py"
    script.write_text(
        textwrap.dedent("""\
        from __future__ import annotations
        import ditorch
        import torch
        print(torch.ones(1, device="cuda").device.type)
    """))
    result = launch(sys.executable, str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "dipu"
