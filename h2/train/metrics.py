"""The metrics log: `metrics.jsonl`, one JSON object per optimizer step.

Records are only ever appended, each in one write. The log is rewritten in two cases only, and then
as a new file renamed over the old one, so that a kill at any moment leaves either the old log or
the new one, never an empty or half-written one: a resumed run drops the records logged after its
checkpoint (`keep_until`), and a run that starts over (`--overwrite`, or a restart before the first
checkpoint) replaces the log by an empty one (`start_over`).

A kill or a full disk during an append can leave a torn last line: readers skip it and say so in
one line on stderr, and a run that continues the log drops it first (`drop_torn_tail`), so that its
appends start on a line of their own. A damaged line before the last is refused (file and line).

`append` is the one path every trainer writes a record through; it also hands the record to the
loggers the run attached (`--log-to`: TensorBoard, W&B offline; h2.train.loggers).
"""

from __future__ import annotations

import json
import os
import sys

from h2.core.errors import RunFailed, UserError
from h2.core.files import atomic_write, os_error_text


class MetricsLog:

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.loggers: list = []

    def attach(self, loggers: list) -> None:
        """Hand every record appended from now on to `loggers` too (h2.train.loggers.open_loggers)."""
        self.loggers.extend(loggers)

    def close(self) -> None:
        """Close the attached loggers (their files complete); appending still works, to the log alone."""
        loggers, self.loggers = self.loggers, []
        for logger in loggers:
            logger.close()

    def records(self) -> list[dict]:
        return read_metrics(self.path) if os.path.exists(self.path) else []

    def keep_until(self, step: int) -> None:
        """Keep only records of steps <= step (a resumed run logs again what came after its checkpoint)."""
        records, torn = _read(self.path) if os.path.exists(self.path) else ([], b"")
        kept = [record for record in records if record["step"] <= step]
        if len(kept) < len(records) or torn:
            self._replace(kept)

    def drop_torn_tail(self) -> None:
        """Rewrite the log without a torn last line, if it has one."""
        if os.path.exists(self.path):
            records, torn = _read(self.path)
            if torn:
                self._replace(records)

    def start_over(self) -> None:
        if os.path.exists(self.path):
            self._replace([])

    def _replace(self, records: list[dict]) -> None:
        text = "".join(json.dumps(record) + "\n" for record in records).encode()
        atomic_write(self.path, lambda handle: handle.write(text))

    def append(self, record: dict) -> None:
        """One record, one write; a full disk or an I/O error is a RunFailed naming the log and the errno
        (a torn last line it may leave is skipped by every reader)."""
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        except OSError as error:
            raise RunFailed(f"cannot write {self.path}: {os_error_text(error)}") from None
        for logger in self.loggers:
            logger.write(record)


def _read(path: str) -> tuple[list[dict], bytes]:
    """The log's records and its torn last line (b"" when the log ends with a whole record)."""
    with open(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # a whole log ends with a newline: its tail is empty
    records = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            if number == len(complete) and not tail.strip():
                return records, line  # the last line written, its newline there but its text cut short
            raise UserError(f"{path} line {number}: not a JSON record (the log is damaged before its last line)") \
                from None
    return records, tail if tail.strip() else b""


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics log; a torn last line is skipped with one line on stderr."""
    records, torn = _read(path)
    if torn:
        print(f"h2: {path}: skipped a torn last line ({len(torn)} bytes, an interrupted write)", file=sys.stderr,
              flush=True)
    return records
