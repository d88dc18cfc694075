"""End to end, a real measurement the host's load decided: `heteroauto profile` of an emulated chip that
needs half of a host core (emu-small of local-emulated, made 0.5 x a core at TP 1 only, the most the trust
rule lets one core's ranks claim), its ranks pinned to one core that a busy loop shares with them at the same
priority. The rank gets half the core at best, its own Python work included, so its kernels run late (here
120-250 % of their emulated time; 8 s and a profile written without the loop) and the profile is refused as
INVALID (one line, exit 2, nothing written). Any other load on the machine only makes it later."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO_ROOT, "configs", "clusters", "local-emulated.yaml")
CORE = min(os.sched_getaffinity(0))
BUSY_LOOPS = 1
SPEED = 0.5


def pinned(command: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(command, preexec_fn=lambda: os.sched_setaffinity(0, {CORE}), **kwargs)


@pytest.fixture
def busy_core():
    loops = [pinned([sys.executable, "-c", "while True: pass  # h2 test: load on one core"]) for _ in range(BUSY_LOOPS)]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


def half_core_chip_cluster(tmp_path) -> str:
    with open(CLUSTER) as handle:
        cluster = yaml.safe_load(handle)
    chip = next(chip for chip in cluster["chips"] if chip["name"] == "emu-small")
    chip.update(emulation={"relative_speed": SPEED}, tp_max=1)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    return str(path)


def test_a_profile_measured_on_an_overloaded_core_is_refused_as_invalid(tmp_path, busy_core):
    out_dir = tmp_path / "profiles"
    job = pinned([
        sys.executable, "-m", "h2.cli.heteroauto", "profile", "--cluster",
        half_core_chip_cluster(tmp_path), "--chip", "emu-small", "--repeats", "1", "--attempts", "1", "--out-dir",
        str(out_dir)
    ], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = job.communicate(timeout=600)
    assert job.returncode == 2, stderr[-2000:]
    assert stderr.splitlines()[-1].startswith("heteroauto: error: INVALID profile of chip 'emu-small' not written: ")
    assert not out_dir.exists() or os.listdir(out_dir) in ([], ["emulated-chips"])
