"""The pipeline launcher stopped or killed: its ranks stop, its job folder in TMPDIR goes (at once on
SIGTERM and SIGINT, at the next launcher's start after a SIGKILL), and nothing prints a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from h2.launch.launcher import JOB_FOLDER_PREFIX, descendants, remove_stale_job_folders

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PP2 = os.path.join(REPO_ROOT, "configs", "strategies", "local-tiny-pp2.yaml")
TRACES = ("Traceback", "frame #", "terminate called")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def job_folders(tmpdir) -> list[str]:
    return [name for name in os.listdir(tmpdir) if name.startswith(JOB_FOLDER_PREFIX)]


def launch_and_signal(tmp_path, signum: int) -> tuple[subprocess.CompletedProcess, list[int], str]:
    """`h2 train --strategy` (two ranks, many steps) with a TMPDIR of its own, sent `signum` (to the
    launcher alone) once its ranks log steps; its outcome, the job's pids then, and the TMPDIR."""
    tmpdir, out = tmp_path / "tmp", tmp_path / "run"
    tmpdir.mkdir()
    job = subprocess.Popen([
        sys.executable, "-m", "h2", "train", "--strategy", PP2, "--steps", "100000", "--checkpoint-every", "0", "--out",
        str(out)
    ], cwd=REPO_ROOT, env={**os.environ, "TMPDIR": str(tmpdir)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-2000:]
            time.sleep(0.1)
        pids = [job.pid, *descendants(job.pid)]
        os.kill(job.pid, signum)
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            for pid in [job.pid, *descendants(job.pid)]:
                os.kill(pid, signal.SIGKILL)
            job.wait()
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr), pids, str(tmpdir)


def wait_gone(pids: list[int], within_s: float = 60) -> list[int]:
    deadline = time.monotonic() + within_s
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.slow
def test_a_sigterm_stops_the_ranks_removes_the_job_folder_and_exits_143(tmp_path):
    result, pids, tmpdir = launch_and_signal(tmp_path, signal.SIGTERM)
    assert result.returncode == 143, result.stderr[-2000:]
    assert not [mark for mark in TRACES if mark in result.stderr], result.stderr[-2000:]
    assert job_folders(tmpdir) == []
    assert wait_gone(pids) == []


@pytest.mark.slow
def test_a_sigint_to_the_launcher_alone_ends_without_a_traceback(tmp_path):
    result, pids, tmpdir = launch_and_signal(tmp_path, signal.SIGINT)
    assert result.returncode == 130, result.stderr[-2000:]
    assert not [mark for mark in TRACES if mark in result.stderr], result.stderr[-2000:]
    assert job_folders(tmpdir) == []
    assert wait_gone(pids) == []


@pytest.mark.slow
def test_a_sigkilled_launchers_ranks_stop_and_its_folder_goes_at_the_next_start(tmp_path):
    result, pids, tmpdir = launch_and_signal(tmp_path, signal.SIGKILL)
    assert result.returncode == -signal.SIGKILL
    assert wait_gone(pids) == []  # the kernel's SIGTERM to its torchrun (PR_SET_PDEATHSIG), which stops the ranks
    assert not [mark for mark in TRACES if mark in result.stderr], result.stderr[-2000:]
    (left, ) = job_folders(tmpdir)
    assert remove_stale_job_folders(tmpdir) == [os.path.join(tmpdir, left)]  # what the next launcher does first
    assert job_folders(tmpdir) == []


def test_only_job_folders_of_launchers_that_are_gone_are_removed(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    with open(f"/proc/{os.getpid()}/stat") as handle:
        started = int(handle.read().rsplit(")", 1)[1].split()[19])
    owners = {
        "dead": {"pid": finished.pid, "started": 1}, "alive": {"pid": os.getpid(), "started": started},
        "reused-pid": {"pid": os.getpid(), "started": started + 1}, "unreadable": "{", "no-owner": None
    }
    for name, owner in owners.items():
        folder = tmp_path / f"{JOB_FOLDER_PREFIX}{name}"
        folder.mkdir()
        if owner is not None:
            (folder / "owner.json").write_text(owner if isinstance(owner, str) else json.dumps(owner))
    (tmp_path / "unrelated").mkdir()
    removed = remove_stale_job_folders(str(tmp_path))
    assert sorted(os.path.basename(path)
                  for path in removed) == [f"{JOB_FOLDER_PREFIX}dead", f"{JOB_FOLDER_PREFIX}reused-pid"]
    assert sorted(os.listdir(tmp_path)) == sorted([
        f"{JOB_FOLDER_PREFIX}alive", f"{JOB_FOLDER_PREFIX}unreadable", f"{JOB_FOLDER_PREFIX}no-owner", "unrelated"
    ])
