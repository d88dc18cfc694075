"""One run per output folder: every command that trains into a folder takes its lock before any work;
a second run on the same folder is refused in one line naming the holder's pid (exit 2), and the
lock goes with its holder's process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from h2.cli.main import main
from h2.core.errors import UserError

LOCK_FILE = ".h2.lock"

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A run in progress as the lock's protocol has it: an exclusive flock on <out>/.h2.lock, its pid inside.
HOLD = """
import fcntl, os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
fd = os.open(os.path.join(sys.argv[1], ".h2.lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def held(tmp_path):
    """`tmp_path/out`, held by another process (as a run in progress holds it)."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield out, holder.pid
    finally:
        holder.kill()
        holder.wait()


def refused(argv: list[str], capsys, pid: int, out) -> None:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"{out}: another run uses this folder (pid {pid} holds {out}/{LOCK_FILE})" in lines[0], lines[0]


TRAIN = ["train", "--preset", "tiny", "--steps", "1", "--micro-batch-size", "2", "--seq-len", "32", "--quiet"]


@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_a_second_single_device_train_on_one_folder_is_refused_naming_the_pid(held, capsys, extra):
    out, pid = held
    refused(TRAIN + ["--out", str(out)] + extra, capsys, pid, out)
    assert sorted(os.listdir(out)) == [LOCK_FILE]  # nothing trained, nothing written


@pytest.mark.parametrize("extra", [[], ["--resume"]])
def test_a_second_pipeline_train_on_one_folder_is_refused_naming_the_pid(held, capsys, extra):
    out, pid = held
    strategy = os.path.join(REPO, "configs", "strategies", "local-tiny-pp2.yaml")
    refused(["train", "--strategy", strategy, "--out", str(out)] + extra, capsys, pid, out)


def test_h2_run_on_a_held_folder_is_refused_before_profiling(held, capsys, tmp_path):
    from tests.h2.test_run import write_cluster

    out, pid = held
    refused(["run", "--cluster",
             write_cluster(tmp_path), "--out",
             str(out), "--profiles",
             str(tmp_path / "profiles")], capsys, pid, out)
    assert not os.path.exists(tmp_path / "profiles")


def test_h2_ps_launch_on_a_held_folder_is_refused(held, capsys, tmp_path):
    out, pid = held
    config = tmp_path / "run.yaml"
    config.write_text(f"mode: dips\nclusters: [{{id: a}}]\nout: {out}\n")
    assert main(["ps", "launch", "--config", str(config), "--overwrite"]) == 2
    line = capsys.readouterr().err.strip()
    assert f"{config}: out {out}: another run uses this folder (pid {pid} holds" in line, line
    assert sorted(os.listdir(out)) == [LOCK_FILE]


def test_the_lock_goes_with_its_holder_and_is_held_once_per_process(held, tmp_path):
    from h2.core.run_lock import hold_output_folder, release_output_folder

    out, pid = held
    with pytest.raises(UserError, match=f"pid {pid}"):
        hold_output_folder(str(out))
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    hold_output_folder(str(out))
    hold_output_folder(str(out))  # the same process again: still its own
    assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    release_output_folder(str(out))


def test_an_out_that_is_a_file_is_one_line(tmp_path):
    from h2.core.run_lock import hold_output_folder

    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="--out .*file: exists and is not a folder"):
        hold_output_folder(str(tmp_path / "file"))


def test_h2_run_stopped_with_sigterm_while_profiling_leaves_nothing_in_tmpdir(tmp_path):
    """Found by the fault campaign (concurrency: `h2 run` holding the folder, stopped once the other run
    was refused): its profiling rank's folder and multiprocessing's were left in TMPDIR."""
    import signal
    import time

    from tests.h2.test_run import write_cluster

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    run = subprocess.Popen([
        sys.executable, "-m", "h2", "run", "--cluster",
        write_cluster(tmp_path), "--out",
        str(tmp_path / "out"), "--profiles",
        str(tmp_path / "profiles")
    ], cwd=REPO, env={**os.environ, "TMPDIR": str(tmpdir)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not [name for name in os.listdir(tmpdir) if name.startswith("h2-ranks-")] and time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1][-2000:]
        time.sleep(0.02)
    run.send_signal(signal.SIGTERM)
    stderr = run.communicate(timeout=120)[1]
    assert run.returncode == 143 and "Traceback" not in stderr, stderr[-2000:]
    assert [name for name in os.listdir(tmpdir) if not name.startswith("torchinductor_")] == []
