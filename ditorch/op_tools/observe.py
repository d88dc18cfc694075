"""Observe: a log of op calls with phase, module path, input and output shapes and dtypes."""

from __future__ import annotations

from typing import TextIO

from ditorch.op_tools.tensors import STDERR, describe_tensors, device_of, open_output
from ditorch.op_tools.tool import OpCall, OpTool


class OpObserve(OpTool):
    """log_path: write one line per call there; stream: also write lines to a stream (e.g. sys.stderr).
    The records stay available as `records` (dicts) when keep_records is set."""

    tool_name = "observe"

    def __init__(self, ops=None, *, log_path: str | None = None, stream: TextIO | None = None,
                 keep_records: bool = True, report: TextIO | None = STDERR, **filters):
        super().__init__(ops, **filters)
        self.log_path = log_path
        self.stream = stream
        self.keep_records = keep_records
        self.report = report
        self.records: list[dict] = []
        self.calls = 0
        self._log = None

    def on_start(self) -> None:
        if self.log_path:
            self._log = open_output(self.log_path)

    def handle(self, call: OpCall):
        out = call.run()
        record = {
            "index": call.index, "op": call.name, "phase": call.phase, "module": call.module, "device": str(
                device_of((call.args, call.kwargs))), "inputs": describe_tensors((call.args, call.kwargs)),
            "outputs": describe_tensors(out)
        }
        self.calls += 1
        if self.keep_records:
            self.records.append(record)
        line = (f"{record['index']:>6} {record['phase']:<8} {record['device']:<7} {record['op']:<40} "
                f"{record['module'] or '-':<40} "
                f"{record['inputs']} -> {record['outputs']}")
        if self._log:
            self._log.write(line + "\n")
        if self.stream:
            print(line, file=self.stream)
        return out

    def on_stop(self) -> None:
        if self._log:
            self._log.close()
            self._log = None
        if self.report is not None:
            print(f"observe: {self.calls} op calls" + (f", log {self.log_path}" if self.log_path else ""),
                  file=self.report)
