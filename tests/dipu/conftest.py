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
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def python_in_subprocess():
    return run_python
