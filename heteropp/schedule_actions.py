"""The one place the runtime asks heteropp.schedule for a stage's action list."""

from __future__ import annotations

from h2.errors import UserError


def stage_actions(schedule: str, num_stages: int, micro_batches: int, stage: int) -> list:
    from heteropp import schedule as schedules
    if schedule == "1f1b":
        return schedules.one_f_one_b(num_stages, micro_batches, stage)
    if schedule == "1f1b-split-backward":
        return schedules.one_f_one_b(num_stages, micro_batches, stage, split=True)
    raise UserError(f"unknown schedule '{schedule}' (known: 1f1b, 1f1b-split-backward)")
