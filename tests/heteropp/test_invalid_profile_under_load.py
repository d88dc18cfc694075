"""End to end, a real measurement the host's load decided: `heteroauto profile` of an emulated chip (emu-small
of local-emulated, 0.2 x a host core) with its ranks pinned to one core that 4 busy loops share with them, at
the same priority. Its kernels cannot get their 20 % of the core, run late, and the profile is refused as
INVALID (one line, exit 2, nothing written). Any other load on the machine only makes it later."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO_ROOT, "configs", "clusters", "local-emulated.yaml")
CORE = min(os.sched_getaffinity(0))


def pinned(command: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(command, preexec_fn=lambda: os.sched_setaffinity(0, {CORE}), **kwargs)


@pytest.fixture
def busy_core():
    loops = [pinned([sys.executable, "-c", "while True: pass  # h2 test: load on one core"]) for _ in range(4)]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


def test_a_profile_measured_on_an_overloaded_core_is_refused_as_invalid(tmp_path, busy_core):
    job = pinned([
        sys.executable, "-m", "h2.cli.heteroauto", "profile", "--cluster", CLUSTER, "--chip", "emu-small", "--repeats",
        "1", "--attempts", "1", "--out-dir",
        str(tmp_path)
    ], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = job.communicate(timeout=600)
    assert job.returncode == 2, stderr[-2000:]
    assert stderr.splitlines()[-1].startswith("heteroauto: error: INVALID profile of chip 'emu-small' not written: ")
    assert os.listdir(tmp_path) == ["emulated-chips"] or os.listdir(tmp_path) == []
