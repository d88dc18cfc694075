"""Where `h2 train --strategy --cluster` starts its ranks (h2.launch.launcher), and how the launcher ends
a job whose ranks do not exit once it has finished."""

import builtins
import os
import shutil
import subprocess
import sys
import time

import pytest

from h2.core.cluster import load_cluster
from h2.core.strategy import strategy_from_mapping
from h2.launch import launcher as launch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = (
    "chips:\n"
    "  - {name: A, count: 2, memory_gb: 1, chips_per_node: 1, tp_max: 1, intra_node_gbps: 10, inter_node_gbps: 1}\n")
STRATEGY = {
    "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "model": "tiny", "stages": [{"chip": "A", "tp": 1, "layers": 2},
                                                                                    {"chip": "A", "tp": 1, "layers": 2}]
}


@pytest.fixture
def started(monkeypatch):
    commands = []
    monkeypatch.setattr(launch.subprocess, "call", lambda command: commands.append(command) or 0)
    monkeypatch.setattr(launch, "run_until_ranks_exit", lambda command, *args: commands.append(command) or 0)
    return commands


def test_without_root_several_nodes_run_on_loopback_and_one_line_says_why(tmp_path, monkeypatch, capsys, started):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    monkeypatch.setattr(launch.netns, "missing_requirements", lambda: ["not root (uid 1000)"])
    status = launch.launch(strategy_from_mapping(STRATEGY, "s.yaml"), load_cluster(tmp_path / "c.yaml"), "job.yaml",
                           "s.yaml")
    assert status == 0 and "--standalone" in started[0]
    assert capsys.readouterr().out == (
        "h2: 2 emulated nodes on loopback, not network namespaces (not root (uid 1000)): "
        "links paced by the pacing layers only\n")


def test_one_node_runs_one_standalone_torchrun_without_namespaces(tmp_path, capsys, started):
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("chips_per_node: 1", "chips_per_node: 2"))
    launch.launch(strategy_from_mapping(STRATEGY, "s.yaml"), load_cluster(tmp_path / "c.yaml"), "job.yaml", "s.yaml")
    assert "--standalone" in started[0] and capsys.readouterr().out == ""


# Stands in for torchrun: starts rank 1 running RANK_1 (argv[2]), then marks rank 0 past the final
# barrier, as h2.cli.rank does, and waits for rank 1 (torchrun waits for every rank, forever).
TORCHRUN_WITH_RANK_1 = """\
import os, subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", sys.argv[2]],
                        env={**os.environ, "RANK": "1", "TORCHELASTIC_RUN_ID": "test"})
open(os.path.join(sys.argv[1], "finished-0"), "w").close()
sys.exit(rank.wait())
"""
HUNG = "import time; time.sleep(60)  # hung while exiting"
STOPS_ITSELF = "import os, signal, time; os.kill(os.getpid(), signal.SIGSTOP); time.sleep(60)"
# Exits after 4 s of CPU work past the final barrier: a rank that a busy host lets exit only slowly.
SLOW_TO_EXIT = "import time\nend = time.process_time() + 4\nwhile time.process_time() < end: pass"


def run_torchrun(tmp_path, rank_1: str, stall_s: float) -> tuple[int, float]:
    script = tmp_path / "torchrun.py"
    script.write_text(TORCHRUN_WITH_RANK_1)
    started = time.monotonic()
    status = launch.run_until_ranks_exit([sys.executable, str(script),
                                          str(tmp_path), rank_1], strategy_from_mapping(STRATEGY, "s.yaml"),
                                         str(tmp_path), stall_s)
    return status, time.monotonic() - started


def survivors(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def test_a_rank_hung_after_the_job_finished_is_killed_and_named(tmp_path, capfd):
    # The fault campaign's ranks family: a rank stuck past the final barrier; torchrun waits for it forever.
    status, took = run_torchrun(tmp_path, HUNG, stall_s=1.0)
    assert status == 1 and took < 30
    assert capfd.readouterr().err == (
        "h2: error: rank 1 (stage 1, chip A) (hung) stopped responding after the job finished (no progress for 1 s "
        "after the final barrier); killed. The run's checkpoints and metrics are complete\n")
    assert survivors("hung while exiting") == []


def test_a_rank_stopped_after_the_job_finished_is_named_as_stopped(tmp_path, capfd):
    status, took = run_torchrun(tmp_path, STOPS_ITSELF, stall_s=1.0)
    assert status == 1 and took < 30
    assert "rank 1 (stage 1, chip A) (stopped by a signal) stopped responding after the job finished" in \
        capfd.readouterr().err
    assert survivors("os.kill(os.getpid(), signal.SIGSTOP)") == []


def test_a_rank_that_keeps_working_after_the_job_finished_is_waited_for(tmp_path, capfd):
    # A busy host: the rank needs longer than the stall timeout to exit, but its CPU time advances.
    status, took = run_torchrun(tmp_path, SLOW_TO_EXIT, stall_s=1.0)
    assert status == 0, capfd.readouterr().err
    assert took > 4 and "stopped responding" not in capfd.readouterr().err


def test_torchrun_slow_to_exit_after_its_ranks_is_waited_for(tmp_path, capfd):
    # No rank left, torchrun itself still exiting (its interpreter's teardown on a busy host).
    script = tmp_path / "torchrun.py"
    script.write_text("import os, sys, time\nopen(os.path.join(sys.argv[1], 'finished-0'), 'w').close()\n"
                      "end = time.process_time() + 3\nwhile time.process_time() < end: pass\n")
    status = launch.run_until_ranks_exit([sys.executable, str(script), str(tmp_path)],
                                         strategy_from_mapping(STRATEGY, "s.yaml"), str(tmp_path), 1.0)
    assert status == 0 and "stopped responding" not in capfd.readouterr().err


def test_a_job_whose_ranks_exit_ends_with_torchruns_status(tmp_path):
    script = tmp_path / "torchrun.py"
    script.write_text("import os, sys\nopen(os.path.join(sys.argv[1], 'finished-0'), 'w').close()\nsys.exit(3)\n")
    assert launch.run_until_ranks_exit([sys.executable, str(script), str(tmp_path)],
                                       strategy_from_mapping(STRATEGY, "s.yaml"), str(tmp_path)) == 3


# ---- the resolved job: read once by the launcher, never by a rank -------------------------------------
TWO_SITES = os.path.join(REPO_ROOT, "configs", "clusters", "local-2site.yaml")
TWO_SITE_PP2 = os.path.join(REPO_ROOT, "configs", "strategies", "local-2site-pp2.yaml")


def counting_reads(watched: list[str], reads: list[str]):
    """builtins.open that appends to `reads` each path of `watched` it opens."""
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) in watched:
            reads.append(os.path.realpath(file))
        return real_open(file, *args, **kwargs)

    return counting_open


def run_rank_counting_reads(rank: int, world_size: int, job_path: str, watched: list[str]) -> dict:
    """A rank of the job file as torchrun runs it (python -m h2.cli.rank --job FILE), in a fresh process:
    its exit status, the watched files it opened, and whether it imported the planner."""
    from h2.cli import rank as rank_entry

    reads: list[str] = []
    builtins.open = counting_reads(watched, reads)
    status = rank_entry.main(["--job", job_path])
    return {"status": status, "reads": reads, "planner_imported": "heteroauto" in sys.modules}


@pytest.mark.slow
def test_the_cluster_file_is_read_once_by_the_launcher_and_never_by_a_rank(tmp_path, monkeypatch):
    from h2.cli.main import main
    from h2.core.ranks import run_ranks

    cluster, strategy = shutil.copy(TWO_SITES, tmp_path), shutil.copy(TWO_SITE_PP2, tmp_path)
    watched = [os.path.realpath(cluster), os.path.realpath(strategy)]
    reads: list[str] = []
    monkeypatch.setattr(builtins, "open", counting_reads(watched, reads))
    job_path = str(tmp_path / "job.yaml")
    monkeypatch.setattr(launch, "launch",
                        lambda strategy, cluster, path, *args, **kwargs: shutil.copy(path, job_path) and 0)
    status = main([
        "train", "--strategy", strategy, "--cluster", cluster, "--schedule", "jeeves", "--steps", "1", "--out",
        str(tmp_path / "run")
    ])
    monkeypatch.undo()
    assert status == 0 and sorted(reads) == sorted(watched)  # each file once, in the launcher
    ranks = run_ranks(run_rank_counting_reads, 2, args=(job_path, watched), timeout=240)
    assert ranks == [{"status": 0, "reads": [], "planner_imported": False}] * 2
    assert os.path.exists(tmp_path / "run" / "metrics.jsonl")
