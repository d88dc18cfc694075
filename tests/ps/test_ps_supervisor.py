"""The launcher's process keeper restarts what died and leaves alone what refused its input."""

import os
import signal
import subprocess
import sys
import time

from h2.ps.supervisor import Child, Supervisor


def run_until_settled(supervisor: Supervisor, names: list[str], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while supervisor.running(names) and time.monotonic() < deadline:
        supervisor.poll()
        time.sleep(0.05)


def test_a_killed_child_is_restarted_with_its_restart_line():
    said = []
    supervisor = Supervisor(said.append)
    supervisor.start(
        Child("worker", ["-c", "import time; time.sleep(30)"], None, restart_argv=lambda: ["-c", "pass"],
              restart_delay_s=0.0))
    supervisor.kill("worker")
    run_until_settled(supervisor, ["worker"])
    child = supervisor.children["worker"]
    assert (child.starts, child.exit_codes) == (2, [-9, 0])
    assert "fault injection: killed worker" in said[0] and "restarted worker (start 2)" in said


def test_a_child_that_exits_with_status_2_is_not_restarted():
    said = []
    supervisor = Supervisor(said.append)
    supervisor.start(Child("bad", ["-c", "raise SystemExit(2)"], None, restart_argv=lambda: ["-c", "pass"]))
    run_until_settled(supervisor, ["bad"])
    assert supervisor.children["bad"].starts == 1
    assert said == ["bad exited with 2 (see its log): not restarted"]


def test_a_child_is_terminated_when_its_launcher_dies(tmp_path):
    launcher = (
        "import sys, time\n"
        "from h2.ps.supervisor import Child, Supervisor\n"
        "supervisor = Supervisor(print)\n"
        f"supervisor.start(Child('worker', ['-c', 'import time; time.sleep(60)'], {str(tmp_path / 'worker.log')!r},\n"
        "                       restart_argv=None))\n"
        "print(supervisor.children['worker'].process.pid, flush=True)\n"
        "time.sleep(1)\n")
    result = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=60)
    pid = int(result.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.1)
    alive = os.path.exists(f"/proc/{pid}") and not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the worker outlived its launcher"
