"""The launcher's exit watch (h2.launch.exit_watch): a finished job's processes judged by their progress."""

import os
import signal
import subprocess
import sys
import time

from h2.launch.exit_watch import ExitWatch, Sample, sample_process


class Clock:

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch_of(samples: dict[int, Sample | None], stall_s: float = 5.0) -> tuple[ExitWatch, Clock]:
    clock = Clock()
    return ExitWatch(stall_s, clock=clock, sample=lambda pid: samples[pid]), clock


def test_a_process_whose_cpu_time_advances_is_never_stalled_however_long_it_takes():
    samples = {7: Sample("R", 0)}
    watch, clock = watch_of(samples)
    for second in range(1, 100):
        clock.now = float(second)
        samples[7] = Sample("R", second)  # one nanosecond of CPU a second: slow, but progress
        assert watch.observe({"rank 1": 7}) == []


def test_a_process_without_progress_for_longer_than_the_timeout_is_named_stopped_or_hung():
    samples = {7: Sample("T", 100), 8: Sample("S", 100)}
    watch, clock = watch_of(samples)
    assert watch.observe({"rank 1": 7, "rank 2": 8}) == []
    clock.now = 5.0
    assert watch.observe({"rank 1": 7, "rank 2": 8}) == []  # not longer than the timeout yet
    clock.now = 5.5
    stalls = watch.observe({"rank 1": 7, "rank 2": 8})
    assert [(s.name, s.pid, s.why()) for s in stalls] == [("rank 1", 7, "stopped by a signal"), ("rank 2", 8, "hung")]


def test_progress_restarts_the_timeout_and_a_gone_process_is_forgotten():
    samples = {7: Sample("S", 1)}
    watch, clock = watch_of(samples)
    watch.observe({"rank 1": 7})
    clock.now = 4.0
    samples[7] = Sample("S", 2)
    watch.observe({"rank 1": 7})
    clock.now = 8.0
    assert watch.observe({"rank 1": 7}) == []  # 4 s since it last moved
    samples[7] = None
    clock.now = 20.0
    assert watch.observe({"rank 1": 7}) == []


def test_sample_process_reads_a_real_processs_state_and_cpu_time():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(200):
            sample = sample_process(child.pid)
            if sample.state == "T":
                break
            time.sleep(0.05)
        assert sample.state == "T" and sample.cpu_ns > 0
        assert sample_process(child.pid).cpu_ns == sample.cpu_ns  # stopped: no progress
    finally:
        child.kill()
        child.wait()
    assert sample_process(child.pid) is None
