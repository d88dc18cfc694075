"""What the Zorse memory, offload and ZeRO-2 benchmarks share: a strategy trained through the product's
own command line (`h2 train --strategy`, a process of its own), what it measured read back from its
metrics.jsonl and stage_report.json, and the machine's load to print before and after."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from h2.core.emulation import stage_report_trust

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load() -> str:
    with open("/proc/loadavg") as handle:
        return "load average " + " ".join(handle.read().split()[:3])


def write_yaml(path: str, data: dict) -> str:
    with open(path, "w") as handle:
        yaml.safe_dump(data, handle, sort_keys=False)
    return path


@dataclass
class StrategyRun:
    """One finished run: its metrics records (one per step) and its stage report (one row per stage)."""
    records: list[dict]
    report: list[dict]

    @property
    def step_s(self) -> float:
        """The median step time after the first step (the first one warms up)."""
        return statistics.median(r["step_time_s"] for r in self.records[1:] or self.records)

    @property
    def loss(self) -> float:
        return self.records[-1]["loss"]

    @property
    def peak_bytes(self) -> int:
        """The largest peak of device memory over the stages (torch.dipu.max_memory_allocated)."""
        return max(row["peak_allocated_bytes"] for row in self.report)

    @property
    def late(self) -> float:
        """The trust rule's fraction of late emulated kernel time over the stages (h2.core.emulation)."""
        return stage_report_trust(self.report).fraction

    @property
    def step_times(self) -> list[float]:
        return [round(r["step_time_s"], 3) for r in self.records]


def train_strategy(bench: str, strategy: dict, out: str, steps: int, flags: Sequence[str] = (),
                   env: dict | None = None) -> StrategyRun:
    """`h2 train --strategy` of `strategy` (written to OUT/strategy.yaml) for `steps` steps into `out`,
    with `flags` (--cluster, --device, ...) and `env` added to the environment; exits naming `bench`
    with h2's stderr when the run fails."""
    os.makedirs(out, exist_ok=True)
    path = write_yaml(os.path.join(out, "strategy.yaml"), strategy)
    run = subprocess.run([
        sys.executable, "-m", "h2.cli.main", "train", "--strategy", path, "--steps",
        str(steps), "--out", out, "--overwrite", "--log-every",
        str(steps), *flags
    ], cwd=REPO_ROOT, text=True, capture_output=True, env=dict(os.environ, **(env or {})))
    if run.returncode != 0:
        sys.exit(f"{bench}: h2 train failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    with open(os.path.join(out, "stage_report.json")) as handle:
        return StrategyRun(records, json.load(handle))
