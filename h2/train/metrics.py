"""The metrics log: `metrics.jsonl`, one JSON object per optimizer step."""

from __future__ import annotations

import json
import os


class MetricsLog:
    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "metrics.jsonl")

    def truncate_after(self, step: int) -> None:
        """Keep only records of steps <= step (a resumed run rewrites what came after its checkpoint)."""
        if not os.path.exists(self.path):
            return
        kept = [record for record in read_metrics(self.path) if record["step"] <= step]
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in kept)

    def reset(self) -> None:
        open(self.path, "w").close()

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def read_metrics(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
