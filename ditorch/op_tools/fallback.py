"""Fallback: selected ops run on the CPU; their results go back to the device the call used."""

from __future__ import annotations

from typing import TextIO

import torch

from ditorch.op_tools.converted_call import run_converted
from ditorch.op_tools.tensors import STDERR, device_of, map_devices
from ditorch.op_tools.tool import OpCall, OpTool, returns_alias

CPU = torch.device("cpu")


class OpFallback(OpTool):
    """Calls whose tensors are all on the CPU already, and views (which must keep sharing memory
    with their input), run unchanged."""

    tool_name = "fallback"

    def __init__(self, ops=None, *, report: TextIO | None = STDERR, **filters):
        super().__init__(ops, **filters)
        self.report = report
        self.counts: dict[str, int] = {}

    def handle(self, call: OpCall):
        device = device_of((call.args, call.kwargs))
        if device.type == "cpu" or returns_alias(call.func):
            return call.run()
        self.counts[call.name] = self.counts.get(call.name, 0) + 1
        return run_converted(call, convert=lambda t: t.to(CPU), convert_back=lambda t: t.to(device),
                             rewrite=lambda value: map_devices(value, CPU))

    def on_stop(self) -> None:
        if self.report is not None:
            ops = ", ".join(f"{op} x{n}" for op, n in self.counts.items()) or "none"
            print(f"fallback: {sum(self.counts.values())} op calls ran on the CPU ({ops})", file=self.report)
