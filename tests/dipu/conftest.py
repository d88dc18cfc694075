import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (emulation profiles are read once per process)."""
    full_env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def python_in_subprocess():
    return run_python


def module_from_file(path: Path):
    """The Python file `path` (a script of no package) imported as a module named after it."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def import_file():
    return module_from_file
