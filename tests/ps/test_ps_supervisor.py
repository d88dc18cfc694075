"""The launcher's process keeper restarts what died and leaves alone what refused its input."""

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
    supervisor.start(Child("worker", ["-c", "import time; time.sleep(30)"], None,
                           restart_argv=lambda: ["-c", "pass"], restart_delay_s=0.0))
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
