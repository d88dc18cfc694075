"""Reading a training loss curve from where users keep it: the h2 trainer's metrics.jsonl (or its
run folder), JSONL and CSV (W&B exports among them), Megatron-LM, torchtitan and nanoGPT logs, and
TensorBoard event files (a file or a run's folder). The format is recognised from the file, or
named. Errors name the file and the line (or event)."""

from __future__ import annotations

import dataclasses
import math
import os

from ditorch.precision import log_formats, tfevents
from h2.core.errors import UserError

METRICS_FILE = "metrics.jsonl"
FORMATS = ("auto", *log_formats.FORMATS)


@dataclasses.dataclass(frozen=True)
class LossLog:
    path: str
    losses: dict[int, float]  # step -> loss, in the file's order
    lines: dict[int, int]  # step -> line (or event) number, for messages
    format: str = "jsonl"
    tokens: dict[int, int] = dataclasses.field(
        default_factory=dict)  # step -> tokens consumed through it, where the log says
    tokens_per_step: int | None = None  # where the log (or the user) says
    unit: str = "line"

    @property
    def steps(self) -> list[int]:
        return list(self.losses)

    def where(self, step: int) -> str:
        return f"{self.path}:{self.lines[step]}" if self.unit == "line" else f"{self.path}: event {self.lines[step]}"

    def with_tokens_per_step(self, tokens_per_step: int) -> "LossLog":
        """The same curve with its token count taken from a constant tokens per step."""
        return dataclasses.replace(self, tokens={}, tokens_per_step=tokens_per_step)

    def consumed_tokens(self, step: int, role: str) -> int:
        """Tokens consumed through `step`: from the log's own count, else from the tokens per step
        (a curve that has a step 0 counts its steps from 0)."""
        if step in self.tokens:
            return self.tokens[step]
        if self.tokens_per_step is None:
            raise UserError(f"{self.path}: --align tokens needs the tokens per step, which this {self.format} "
                            f"log does not state; pass --{role}-tokens-per-step N")
        first = 0 if 0 in self.losses else 1
        return (step - first + 1) * self.tokens_per_step


def _read_text(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except UnicodeDecodeError:
        raise UserError(
            f"{path}: not a text file (expected JSONL, CSV, a training log or TensorBoard events)") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror or error})") from None


def _looks_like_events(path: str) -> bool:
    if "tfevents" in os.path.basename(path):
        return True
    try:
        with open(path, "rb") as handle:
            return tfevents.is_event_file(handle.read(12))
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror or error})") from None


def _records(path: str, form: str, key: str | None) -> log_formats.Records:
    if os.path.isdir(path):
        metrics = os.path.join(path, METRICS_FILE)
        if form in ("auto", "h2", "jsonl") and os.path.isfile(metrics):
            return log_formats.read_jsonl(metrics, _read_text(metrics), key)
        files = log_formats.event_files(path) if form in ("auto", "tensorboard") else []
        if files:
            return log_formats.read_tensorboard(files, key)
        raise UserError(f"{path}: a folder without {METRICS_FILE} or TensorBoard event files "
                        f"(pass the log file or a run folder)")
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file or folder")
    if form == "tensorboard" or (form == "auto" and _looks_like_events(path)):
        return log_formats.read_tensorboard([path], key)
    lines = _read_text(path)
    if form == "auto":
        form = log_formats.detect_text_format(path, lines)
    return log_formats.TEXT_READERS[form](path, lines, key)


def read_loss_log(path: str, form: str = "auto", key: str | None = None) -> LossLog:
    """Steps and losses of a log. Non-finite losses are kept (the comparison rejects them where it
    uses them). `form` names the format (`auto`: recognise it); `key` the loss column, field or tag."""
    if form not in FORMATS:
        raise UserError(f"unknown log format '{form}' (one of {', '.join(FORMATS)})")
    records = _records(path, form, key)
    shown = os.path.join(path, METRICS_FILE) if records.format in ("h2", "jsonl") and os.path.isdir(path) else path
    losses: dict[int, float] = {}
    position: dict[int, int] = {}
    tokens: dict[int, int] = {}
    for at, step, loss, consumed in records.rows:
        if step in losses:
            raise UserError(f"{shown}:{at}: step {step} appears twice (first on line {position[step]})")
        losses[step], position[step] = loss, at
        if consumed is not None:
            tokens[step] = consumed
    if not losses:
        raise UserError(f"{shown}: no loss records" +
                        ("" if records.format in ("h2", "jsonl", "csv") else f" (read as a {records.format} log)"))
    return LossLog(shown, losses, position, records.format, tokens, records.tokens_per_step, records.unit)


def check_finite(log: LossLog, steps: list[int], role: str) -> None:
    for step in steps:
        if not math.isfinite(log.losses[step]):
            raise UserError(f"{log.where(step)}: {role} loss is {log.losses[step]} at step {step} (non-finite)")
