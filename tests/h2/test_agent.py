"""How a pipeline job reports ranks that a signal ended (h2.launch.agent runs torchrun and records its
ranks' exit statuses; h2.launch.launcher.report_rank_deaths turns them into one line per dead rank)."""

import json
import os
import subprocess
import sys

from h2.core.strategy import strategy_from_mapping
from h2.launch import launcher as launch
from h2.launch.agent import read_failures, write_failures
from h2.launch.contract import FAILURES_PREFIX, FINISHED_PREFIX

STRATEGY = {
    "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "model": "tiny", "stages": [{"chip": "A", "tp": 1, "layers": 2},
                                                                                    {"chip": "B", "tp": 1, "layers": 2}]
}
RANK_1_KILLS_ITSELF = """\
import os, signal, time
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def run_agent(tmp_path, script: str):
    (tmp_path / "worker.py").write_text(script)
    failures = tmp_path / "failures-0.json"
    completed = subprocess.run([
        sys.executable, "-m", "h2.launch.agent",
        str(failures), "--standalone", "--nproc-per-node", "2", "--log-dir",
        str(tmp_path / "logs"),
        str(tmp_path / "worker.py")
    ], capture_output=True, text=True, timeout=120)
    return completed, failures


def test_the_agent_records_each_failed_rank_and_prints_no_torchrun_traceback(tmp_path):
    completed, failures = run_agent(tmp_path, RANK_1_KILLS_ITSELF)
    assert completed.returncode == 1, completed.stderr[-2000:]
    recorded = json.loads(failures.read_text())
    assert recorded["1"] == -9 and recorded.get("0", -15) == -15  # rank 0: stopped by torchrun (SIGTERM)
    assert "Traceback" not in completed.stderr and "ChildFailedError" not in completed.stderr, completed.stderr


def test_the_agent_writes_nothing_when_every_rank_succeeds(tmp_path):
    completed, failures = run_agent(tmp_path, "print('ok')\n")
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert not failures.exists()


def test_failures_are_written_whole_and_read_back(tmp_path):
    write_failures(str(tmp_path / "f.json"), {1: -9, 0: 143})
    assert read_failures(str(tmp_path / "f.json")) == {0: 143, 1: -9}
    assert read_failures(str(tmp_path / "missing.json")) == {}
    assert os.listdir(tmp_path) == ["f.json"]


def report(tmp_path, capsys, exit_codes: dict, finished: bool) -> str:
    write_failures(str(tmp_path / f"{FAILURES_PREFIX}0.json"), exit_codes)
    if finished:
        (tmp_path / f"{FINISHED_PREFIX}0").write_text("")
    launch.report_rank_deaths(strategy_from_mapping(STRATEGY, "s.yaml"), str(tmp_path))
    return capsys.readouterr().err


def test_a_rank_killed_mid_run_is_named_with_its_stage_chip_and_signal(tmp_path, capsys):
    assert report(tmp_path, capsys, {0: 143, 1: -9}, finished=False) == \
        "h2: error: rank 1 (stage 1, chip B) died (killed by SIGKILL)\n"


def test_a_rank_killed_after_the_final_barrier_is_named_and_the_run_said_complete(tmp_path, capsys):
    # The fault campaign's ranks family: rank 1 SIGKILLed as it exited after the job's last step;
    # torchrun stopped rank 0 before its watchdog could name the loss.
    assert report(tmp_path, capsys, {0: -15, 1: -9}, finished=True) == (
        "h2: error: rank 1 (stage 1, chip B) died (killed by SIGKILL) after the job finished (every rank had "
        "reached the final barrier): the run's checkpoints and metrics are complete\n")


def test_ranks_that_failed_by_themselves_or_were_stopped_by_torchrun_get_no_extra_line(tmp_path, capsys):
    assert report(tmp_path, capsys, {0: 1, 1: 143}, finished=False) == ""
