"""h2.core.ranks: one function on N local processes, results in rank order, failures named with
their rank, error and output, and no rank left running after a failure or a timeout."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from h2.core.ranks import RankFailure, run_ranks, start_ranks

TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_targets.py")
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def report(rank, world_size, *args, **kwargs):
    time.sleep(0.1 * (world_size - rank))  # the last rank finishes first
    return {
        "rank": rank, "world_size": world_size, "args": list(args), "kwargs": kwargs,
        "env": {name: os.environ[name] for name in RENDEZVOUS + ("EXTRA", )}
    }


def test_results_come_back_in_rank_order_with_the_rendezvous_environment_and_extra_variables():
    results = run_ranks(report, 3, args=(7, "x"), kwargs={"k": [1]}, env=lambda rank: {"EXTRA": f"e{rank}"}, timeout=60)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world_size"] == 3 and r["args"] == [7, "x"] and r["kwargs"] == {"k": [1]} for r in results)
    for rank, r in enumerate(results):
        env = r["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["EXTRA"]) == (str(rank), str(rank), "3",
                                                                                     f"e{rank}")
        assert env["MASTER_ADDR"] == "127.0.0.1"
    assert len({r["env"]["MASTER_PORT"] for r in results}) == 1


def raise_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 gives up")
    time.sleep(120)  # stands for waiting on rank 1 forever


def test_a_rank_that_raises_is_named_with_its_error_and_the_other_ranks_are_stopped_at_once():
    started = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        run_ranks(raise_on_rank_1, 3, timeout=100)
    assert time.monotonic() - started < 30  # not the timeout, not the sleep
    assert failure.value.ranks == [1]
    message = str(failure.value)
    assert "rank 1 of 3" in message and "raised ValueError: rank 1 gives up" in message
    assert "in raise_on_rank_1" in message  # the traceback from its stderr
    assert "ranks 0, 2 were still running and were killed" in message


def exit_without_returning(rank, world_size):
    if rank == 0:
        os._exit(3)
    return rank


def test_a_rank_that_exits_without_returning_is_a_failure_naming_its_exit_code():
    with pytest.raises(RankFailure, match="rank 0 of 2 .* exited with code 3 without returning") as failure:
        run_ranks(exit_without_returning, 2, timeout=60)
    assert failure.value.ranks == [0]


def hang_on_rank_0(rank, world_size):
    if rank == 0:
        print("rank 0 is stuck in its collective", file=sys.stderr, flush=True)
        time.sleep(120)
    return rank


def test_a_rank_that_hangs_is_killed_at_the_timeout_and_named_with_its_output():
    started = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        run_ranks(hang_on_rank_0, 2, timeout=3)
    assert time.monotonic() - started < 30
    assert failure.value.ranks == [0]
    message = str(failure.value)
    assert "rank 0 of 2" in message and "did not finish within 3 s and was killed" in message
    assert "rank 0 stderr" in message and "rank 0 is stuck in its collective" in message


def test_a_file_and_function_target_is_loaded_by_path_in_the_rank_after_its_environment_is_set():
    results = run_ranks(f"{TARGETS}:environment_at_import", 2, env={"H2_RANKS_TEST_VALUE": "set"}, timeout=60)
    assert results == [{"rank": r, "world_size": 2, "seen_at_import": "set"} for r in range(2)]
    assert "rank_targets" not in sys.modules


def sleep_unless_rank_0(rank, world_size):
    if rank != 0:
        time.sleep(120)
    return os.getpid()


def test_the_job_handle_kills_one_rank_on_purpose_and_still_collects_another():
    with start_ranks(sleep_unless_rank_0, 3) as job:
        job.kill(1)
        assert job.wait(1, timeout=30) == -signal.SIGKILL
        assert job.results(ranks=[0], timeout=60) == [job.pid(0)]
        assert job.exitcode(2) is None  # neither watched nor finished: still running
    assert job.exitcode(2) == -signal.SIGKILL  # the end of the with block stops it


def test_a_function_that_cannot_be_found_by_name_in_a_rank_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="not a module-level function"):
        run_ranks(lambda rank, world_size: rank, 2)
    with pytest.raises(ValueError, match="expected 'path/to/file.py:function'"):
        run_ranks("rank_targets.environment_at_import", 2)


FORKSERVER = """
import json, os, sys
from h2.core.ranks import run_ranks

def look(rank, world_size):
    return {"rank": rank, "preloaded": "xml.dom.minidom" in sys.modules, "extra": os.environ["EXTRA"],
            "forked_from_the_caller": os.getppid() == int(os.environ["CALLER"])}

if __name__ == "__main__":
    print(json.dumps(run_ranks(look, 2, env={"EXTRA": "fs", "CALLER": os.getpid()}, start_method="forkserver",
                               preload=["xml.dom.minidom"], timeout=60)))
"""


def test_forkserver_ranks_fork_from_a_server_that_imported_the_preload_list(tmp_path):
    # In a fresh interpreter: the forkserver and its preload list are per process.
    script = tmp_path / "forkserver_job.py"
    script.write_text(FORKSERVER)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert results == [{"rank": r, "preloaded": True, "extra": "fs", "forked_from_the_caller": False} for r in range(2)]


def test_the_harness_imports_no_torch():
    code = "import sys, h2.core.ranks; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def note_pid_and_wait(rank, world_size, marks):
    with open(os.path.join(marks, f"rank{rank}.pid"), "w") as handle:
        handle.write(f"{os.getpid()} {os.getppid()}")
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(marks, "release")) and time.monotonic() < deadline:
        time.sleep(0.05)


KILLED_JOB = """
import sys
from h2.core.ranks import run_ranks
run_ranks(sys.argv[1], 2, args=(sys.argv[2],), start_method="forkserver", timeout=120)
"""


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_folders_of_a_job_killed_with_sigkill_are_removed_at_the_next_jobs_start(tmp_path, monkeypatch):
    import tempfile

    scratch_root, marks = tmp_path / "tmp", tmp_path / "marks"
    scratch_root.mkdir()
    marks.mkdir()
    (scratch_root / "pymp-of-someone-else").mkdir()  # no owner record: never removed
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_JOB, f"{os.path.abspath(__file__)}:note_pid_and_wait",
         str(marks)], env=dict(os.environ, TMPDIR=str(scratch_root)))
    try:
        wait_for(lambda: all((marks / f"rank{rank}.pid").exists() for rank in range(2)))
        killed.kill()
        killed.wait()
    finally:
        (marks / "release").touch()  # the orphaned ranks end, then their forkserver
    orphans = {int(pid) for rank in range(2) for pid in (marks / f"rank{rank}.pid").read_text().split()}
    wait_for(lambda: not [pid for pid in orphans if os.path.exists(f"/proc/{pid}")])
    left = sorted(os.listdir(scratch_root))
    assert [name for name in left
            if name.startswith("h2-ranks-")] and len([name for name in left if name.startswith("pymp-")]) == 2, left
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    assert run_ranks(report, 1, env={"EXTRA": "x"}, timeout=60)[0]["rank"] == 0
    assert os.listdir(scratch_root) == ["pymp-of-someone-else"]


def test_a_forkserved_rank_whose_job_was_stopped_while_it_was_forked_exits_without_a_traceback(tmp_path):
    """The job's folder (its logs) removed before the rank opened them, as a stopped job does (found by
    the fault campaign: `h2 run` SIGTERMed while it started a profiling rank)."""
    gone = str(tmp_path / "h2-ranks-stopped")
    code = ("import sys; from h2.core.ranks import _forkserved; "
            f"_forkserved({gone + '/spec.pickle'!r}, 0, {{}}, {gone + '/rank0.out'!r}, {gone + '/rank0.err'!r})")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr == "", result.stderr[-2000:]
