"""A finished pipeline on a busy host exits 0 (h2.launch.exit_watch judges its ranks by their progress, not a
wall clock), and a SIGSTOPped rank on the same busy host is still named: `h2 train` of a 3-stage pipeline of
the tiny model while 4 x the host's cores of busy loops compete with it at the same priority."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test_heteropp_rank_loss import rank_pids

pytestmark = pytest.mark.slow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PP3 = """\
dp: 1
micro_batches: 2
micro_batch_size: 1
seq_len: 32
schedule: 1f1b
model: {preset: tiny, num_layers: 3}
stages:
  - {chip: A, tp: 1, layers: 1}
  - {chip: A, tp: 1, layers: 1}
  - {chip: A, tp: 1, layers: 1}
"""
STEPS = 3
RANK_TIMEOUT_S = 20.0
BUSY_LOOP = "while True: pass  # h2 test: host load"


@pytest.fixture
def busy_host():
    """4 x the cores of busy loops, at this test's own priority (they compete with the job)."""
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(4 * (os.cpu_count() or 1))]
    time.sleep(1.0)
    yield len(loops)
    for loop in loops:
        loop.kill()
        loop.wait()


def h2_train(tmp_path, out: str) -> subprocess.Popen:
    (tmp_path / "pp3.yaml").write_text(PP3)
    return subprocess.Popen([
        sys.executable, "-m", "h2", "train", "--strategy",
        str(tmp_path / "pp3.yaml"), "--steps",
        str(STEPS), "--rank-timeout",
        str(RANK_TIMEOUT_S), "--out", out
    ], cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def logged_steps(out: str) -> list[int]:
    try:
        with open(os.path.join(out, "metrics.jsonl")) as handle:
            return [json.loads(line)["step"] for line in handle if line.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def finish(job: subprocess.Popen, timeout_s: float) -> str:
    try:
        return job.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        return job.communicate()[1] + f"\n(test: still running after {timeout_s:g} s; killed)"


def test_a_finished_three_stage_pipeline_on_a_busy_host_exits_0(tmp_path, busy_host):
    out = str(tmp_path / "run")
    job = h2_train(tmp_path, out)
    stderr = finish(job, 600)
    assert job.returncode == 0, stderr[-2000:]
    assert logged_steps(out) == list(range(1, STEPS + 1))
    assert "stopped responding" not in stderr


def test_a_stopped_rank_on_a_busy_host_is_still_named(tmp_path, busy_host):
    out = str(tmp_path / "run")
    job = h2_train(tmp_path, out)
    try:
        deadline = time.monotonic() + 400
        while (not logged_steps(out) or len(ranks := rank_pids(job.pid)) < 3) and job.poll() is None:
            assert time.monotonic() < deadline, "the job logged no step"
            time.sleep(0.05)
        os.kill(ranks[2], signal.SIGSTOP)
        stderr = finish(job, 300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode not in (0, None)
    assert "rank 2 (stage 2, chip A)" in stderr and "stopped responding" in stderr, stderr[-2000:]
