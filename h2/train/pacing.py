"""Emulated cluster speed for a training loop: every step padded to a target time by sleeping.

The emulated time of a step never depends on how busy the host is: the pacer sleeps until the step's
target time has passed since it started, and never burns CPU. A step whose real compute already took
longer than the target (the host cannot emulate that speed right now) is counted as an overrun, so
a run can report that its emulation was not honest: `trust()` is the verdict of h2.core.emulation
(INVALID when the overrun time exceeds UNTRUSTED_FRACTION of the paced time).
"""

from __future__ import annotations

import time

from h2.core.emulation import MeasurementTrust, measurement_trust


class Pacer:

    def __init__(self, step_s: float):
        self.step_s = step_s
        self.overruns = 0
        self.steps = 0
        self.worst_compute_s = 0.0
        self.overrun_s = 0.0  # by how much the overrunning steps passed their target, in all

    def pad(self, started: float) -> float:
        """Sleep until `step_s` has passed since `started` (a perf_counter time); the compute seconds."""
        compute_s = time.perf_counter() - started
        if self.step_s <= 0:
            return compute_s
        self.steps += 1
        self.worst_compute_s = max(self.worst_compute_s, compute_s)
        if compute_s > self.step_s:
            self.overruns += 1
            self.overrun_s += compute_s - self.step_s
        else:
            time.sleep(self.step_s - compute_s)
        return compute_s

    def trust(self) -> MeasurementTrust:
        """The paced steps' verdict: their overrun time against the time they were paced to."""
        return measurement_trust(self.overrun_s, self.steps * self.step_s, "paced step time")
