"""The metrics log: `metrics.jsonl`, one JSON object per optimizer step.

Records are only ever appended, each in one write. The log is rewritten in two cases only, and then
as a new file renamed over the old one, so that a kill at any moment leaves either the old log or
the new one, never an empty or half-written one: a resumed run drops the records logged after its
checkpoint (`keep_until`), and a run that starts over (`--overwrite`, or a restart before the first
checkpoint) replaces the log by an empty one (`start_over`).
"""

from __future__ import annotations

import json
import os

from h2.train.checkpoint import atomic_write


class MetricsLog:
    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "metrics.jsonl")

    def records(self) -> list[dict]:
        return read_metrics(self.path) if os.path.exists(self.path) else []

    def keep_until(self, step: int) -> None:
        """Keep only records of steps <= step (a resumed run logs again what came after its checkpoint)."""
        records = self.records()
        kept = [record for record in records if record["step"] <= step]
        if len(kept) < len(records):
            self._replace(kept)

    def start_over(self) -> None:
        if os.path.exists(self.path):
            self._replace([])

    def _replace(self, records: list[dict]) -> None:
        text = "".join(json.dumps(record) + "\n" for record in records).encode()
        atomic_write(self.path, lambda handle: handle.write(text))

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def read_metrics(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
