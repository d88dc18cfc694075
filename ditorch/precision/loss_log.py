"""Reading a training loss log: the h2 trainer's metrics.jsonl, a run folder holding one, or a CSV
of step,loss (with or without a header). Errors name the file and line."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os

from h2.core.errors import UserError

METRICS_FILE = "metrics.jsonl"


@dataclasses.dataclass(frozen=True)
class LossLog:
    path: str
    losses: dict[int, float]  # step -> loss, in the file's order
    lines: dict[int, int]  # step -> line number, for messages

    @property
    def steps(self) -> list[int]:
        return list(self.losses)

    def where(self, step: int) -> str:
        return f"{self.path}:{self.lines[step]}"


def _parse_step(value, where: str) -> int:
    if isinstance(value, bool):
        raise UserError(f"{where}: step {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return _parse_step(float(value) if "." in value or "e" in value.lower() else int(value), where)
        except ValueError:
            pass
    raise UserError(f"{where}: step {value!r} is not an integer")


def _parse_loss(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"{where}: loss {value!r} is not a number")
    try:
        return float(value)
    except ValueError:
        raise UserError(f"{where}: loss {value!r} is not a number") from None


def _read_text(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (expected JSONL or CSV)") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror or error})") from None


def _jsonl_records(path: str, lines: list[str]):
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected a JSON object with 'step' and 'loss'")
        for field in ("step", "loss"):
            if field not in record:
                raise UserError(f"{where}: field '{field}' missing")
        yield number, _parse_step(record["step"], where), _parse_loss(record["loss"], where)


def _is_header(row: list[str]) -> bool:
    try:
        [float(cell) for cell in row]
        return False
    except ValueError:
        return True


def _csv_records(path: str, lines: list[str]):
    rows = [(number, row) for number, row in enumerate(csv.reader(lines), start=1)
            if row and any(cell.strip() for cell in row)]
    step_column, loss_column = 0, 1
    if rows and _is_header(rows[0][1]):
        header = [cell.strip().lower() for cell in rows[0][1]]
        for field in ("step", "loss"):
            if field not in header:
                raise UserError(f"{path}:{rows[0][0]}: CSV header has no '{field}' column (columns: {', '.join(header)})")
        step_column, loss_column = header.index("step"), header.index("loss")
        rows = rows[1:]
    for number, row in rows:
        where = f"{path}:{number}"
        if len(row) <= max(step_column, loss_column):
            raise UserError(f"{where}: expected step,loss, got {','.join(row)!r}")
        yield number, _parse_step(row[step_column].strip(), where), _parse_loss(row[loss_column].strip(), where)


def _resolve(path: str) -> str:
    if os.path.isdir(path):
        metrics = os.path.join(path, METRICS_FILE)
        if not os.path.isfile(metrics):
            raise UserError(f"{path}: a folder without {METRICS_FILE} (pass the log file or a run folder)")
        return metrics
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file or folder")
    return path


def read_loss_log(path: str) -> LossLog:
    """Steps and losses of a log. Non-finite losses are kept (the comparison rejects them where it uses them)."""
    path = _resolve(path)
    lines = _read_text(path)
    first = next((line.strip() for line in lines if line.strip()), "")
    is_jsonl = path.endswith((".jsonl", ".json")) or first.startswith("{")
    records = _jsonl_records(path, lines) if is_jsonl else _csv_records(path, lines)
    losses: dict[int, float] = {}
    line_of: dict[int, int] = {}
    for number, step, loss in records:
        if step in losses:
            raise UserError(f"{path}:{number}: step {step} appears twice (first on line {line_of[step]})")
        losses[step], line_of[step] = loss, number
    if not losses:
        raise UserError(f"{path}: no loss records")
    return LossLog(path, losses, line_of)


def check_finite(log: LossLog, steps: list[int], role: str) -> None:
    for step in steps:
        if not math.isfinite(log.losses[step]):
            raise UserError(f"{log.where(step)}: {role} loss is {log.losses[step]} at step {step} (non-finite)")
