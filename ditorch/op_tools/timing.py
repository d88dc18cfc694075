"""Time measure: wall time of each selected op call, with the device synchronised before and
after, written to a CSV; a totals table per op at the end."""

from __future__ import annotations

import dataclasses
import time
from typing import TextIO

from ditorch.op_tools.tensors import STDERR, CsvRows, describe_tensors, device_of, synchronize
from ditorch.op_tools.tool import OpCall, OpTool

CSV_FIELDS = ["index", "op", "phase", "module", "inputs", "device", "time_ms"]


@dataclasses.dataclass
class OpTotal:
    op: str
    calls: int
    total_ms: float

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.calls


class OpTimeMeasure(OpTool):
    tool_name = "time measure"

    def __init__(self, ops=None, *, csv_path: str | None = None, report: TextIO | None = STDERR, **filters):
        super().__init__(ops, **filters)
        self.csv_path = csv_path
        self.report = report
        self.log = CsvRows(csv_path, CSV_FIELDS)
        self.rows = self.log.rows

    def on_start(self) -> None:
        self.log.open()

    def handle(self, call: OpCall):
        device = device_of((call.args, call.kwargs))
        synchronize(device)
        started = time.perf_counter()
        out = call.run()
        synchronize(device)
        elapsed_ms = 1e3 * (time.perf_counter() - started)
        row = {
            "index": call.index, "op": call.name, "phase": call.phase, "module": call.module,
            "inputs": describe_tensors((call.args, call.kwargs)), "device": str(device), "time_ms": elapsed_ms
        }
        self.log.append(row)
        return out

    def totals(self) -> list[OpTotal]:
        """Per op and phase, sorted by total time, largest first."""
        totals: dict[str, OpTotal] = {}
        for row in self.rows:
            key = f"{row['op']} {row['phase']}"
            total = totals.setdefault(key, OpTotal(key, 0, 0.0))
            total.calls += 1
            total.total_ms += row["time_ms"]
        return sorted(totals.values(), key=lambda t: t.total_ms, reverse=True)

    def format_totals(self, limit: int = 30) -> str:
        totals = self.totals()
        grand = sum(t.total_ms for t in totals) or 1.0
        width = max([len(t.op) for t in totals[:limit]] + [2])
        lines = [f"{'op':<{width}} {'calls':>7} {'total ms':>11} {'mean ms':>9} {'share':>7}"]
        lines += [
            f"{t.op:<{width}} {t.calls:>7} {t.total_ms:>11.3f} {t.mean_ms:>9.4f} {100 * t.total_ms / grand:>6.1f}%"
            for t in totals[:limit]
        ]
        if len(totals) > limit:
            rest = totals[limit:]
            lines.append(f"{f'({len(rest)} more ops)':<{width}} {sum(t.calls for t in rest):>7} "
                         f"{sum(t.total_ms for t in rest):>11.3f}")
        lines.append(f"{'total':<{width}} {len(self.rows):>7} {sum(t.total_ms for t in totals):>11.3f}")
        return "\n".join(lines)

    def on_stop(self) -> None:
        self.log.close()
        if self.report is not None:
            print(f"time measure: {len(self.rows)} op calls" + (f", csv {self.csv_path}" if self.csv_path else ""),
                  file=self.report)
            print(self.format_totals(), file=self.report)
