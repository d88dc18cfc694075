"""The launcher's exit watch: a pipeline job whose ranks have all passed the final barrier has done its
work (a rank marks itself finished in the job folder, h2.launch.contract), and only has to exit. torchrun
waits for every rank forever, so a rank stopped or hung while exiting would keep the job open: the watch
ends it. It judges each process by its progress, never by a wall clock, so that a busy host, on which
exiting takes long, does not turn a finished run into a failure:

  - from the first finished mark on, every rank process still running (torchrun's workers), and torchrun
    itself once no rank is left, is sampled every poll: its CPU time (/proc/PID/schedstat, nanoseconds;
    /proc/PID/stat's clock ticks where schedstat is missing) and its state;
  - a process whose CPU time advances is making progress, however slowly the host lets it: it is waited
    for;
  - a process whose CPU time has not moved for `stall_s` seconds (stopped by SIGSTOP, or blocked for
    good: hung) is named and killed, with the rest of the job, and the job's status is 1.

`stall_s` is the job's --rank-timeout, the same timeout after which a rank that stopped responding mid-run
is named (h2.train.watchdog). A rank that keeps spending CPU after the final barrier (spinning forever) is
waited for; nothing the ranks run after the barrier loops.

Linux only (/proc), as the launcher's rank lookup is. Imports nothing of H2.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

STOPPED_STATES = ("T", "t")  # stopped by a signal (SIGSTOP, SIGTSTP), or by a tracer
GONE_STATES = ("Z", "X", "x")  # exited; its parent has not reaped it yet


@dataclass(frozen=True)
class Sample:
    """One look at a process: its state letter and the CPU time it has used, in nanoseconds."""
    state: str
    cpu_ns: int


def sample_process(pid: int) -> Sample | None:
    """`pid`'s state and CPU time; None when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    state = fields[0]
    if state in GONE_STATES:
        return None
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as handle:
            cpu_ns = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        cpu_ns = ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return Sample(state, cpu_ns)


@dataclass
class _Progress:
    cpu_ns: int
    moved_at: float
    state: str


@dataclass(frozen=True)
class Stall:
    """A process that made no progress for the stall timeout: its name, pid, and whether it was stopped."""
    name: str
    pid: int
    stopped: bool

    def why(self) -> str:
        return "stopped by a signal" if self.stopped else "hung"


@dataclass
class ExitWatch:
    """Progress of the processes a finished job still runs. `observe({name: pid})` each poll; it returns
    the processes whose CPU time has not advanced for `stall_s` seconds (empty while all progress)."""
    stall_s: float
    clock: Callable[[], float] = time.monotonic
    sample: Callable[[int], Sample | None] = sample_process
    _seen: dict[int, _Progress] = field(default_factory=dict)

    def observe(self, processes: dict[str, int]) -> list[Stall]:
        now = self.clock()
        stalls = []
        for name, pid in processes.items():
            sample = self.sample(pid)
            if sample is None:
                self._seen.pop(pid, None)
                continue
            seen = self._seen.get(pid)
            if seen is None or sample.cpu_ns != seen.cpu_ns:
                self._seen[pid] = _Progress(sample.cpu_ns, now, sample.state)
                continue
            seen.state = sample.state
            if now - seen.moved_at > self.stall_s:
                stalls.append(Stall(name, pid, sample.state in STOPPED_STATES))
        return stalls
