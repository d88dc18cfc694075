"""Emulated cluster speed for a training loop: every step padded to a target time by sleeping.

The emulated time of a step never depends on how busy the host is: the pacer sleeps until the step's
target time has passed since it started, and never burns CPU. A step whose real compute already took
longer than the target (the host cannot emulate that speed right now) is counted as an overrun, so
a run can report that its emulation was not honest.
"""

from __future__ import annotations

import time


class Pacer:

    def __init__(self, step_s: float):
        self.step_s = step_s
        self.overruns = 0
        self.steps = 0
        self.worst_compute_s = 0.0

    def pad(self, started: float) -> float:
        """Sleep until `step_s` has passed since `started` (a perf_counter time); the compute seconds."""
        compute_s = time.perf_counter() - started
        if self.step_s <= 0:
            return compute_s
        self.steps += 1
        self.worst_compute_s = max(self.worst_compute_s, compute_s)
        if compute_s > self.step_s:
            self.overruns += 1
        else:
            time.sleep(self.step_s - compute_s)
        return compute_s
