"""Shared test fixtures: the project's CLIs run as a user would run them, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Many tests start several processes on a 2-core machine; one intra-op thread each keeps them from
# oversubscribing the cores (set before torch is imported, inherited by every subprocess).
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def restore_environment():
    """A test that runs a CLI in this process (which may export variables for its workers, such as
    DIPU_HOST_PROFILE) leaves the environment of later tests' subprocesses as it found it."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


def run_cli(module: str, *args: str, cwd: str | None = None, env: dict | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m module args...` and return the completed process (text output)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli
