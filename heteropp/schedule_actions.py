"""The one place the runtime asks heteropp.schedule for this stage's action list."""

from __future__ import annotations

from h2.errors import UserError
from heteropp.schedule import SCHEDULES, schedule_actions


def stage_actions(schedule: str, num_stages: int, micro_batches: int, stage: int) -> list:
    if schedule not in SCHEDULES:
        raise UserError(f"unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
    return schedule_actions(schedule, num_stages, micro_batches)[stage]
