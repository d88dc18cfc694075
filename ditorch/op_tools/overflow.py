"""Overflow check: name the first op call whose floating-point outputs hold NaN or Inf (or, with
`range_dtype`, values beyond that dtype's range) while its inputs did not, with its inputs'
statistics. Later calls that only propagate non-finite inputs are not origins."""

from __future__ import annotations

import dataclasses
from typing import TextIO

import torch

from ditorch.op_tools.tensors import STDERR, format_stats, hidden, tensor_stats, tensors_of
from ditorch.op_tools.tool import OpCall, OpTool, returns_alias


@dataclasses.dataclass
class OverflowEvent:
    index: int
    op: str
    phase: str
    module: str
    kind: str  # 'nan', 'inf', 'nan+inf' or 'beyond float16 range'
    output_index: int
    input_stats: list[dict]
    output_stats: dict

    def describe(self) -> str:
        lines = [
            f"overflow check: call {self.index} {self.op} ({self.phase}) in {self.module or '<no module>'} "
            f"produced {self.kind} in output {self.output_index} ({format_stats(self.output_stats)})"
        ]
        lines += [f"  input {i}: {format_stats(stats)}" for i, stats in enumerate(self.input_stats)]
        return "\n".join(lines)


class OpOverflowError(FloatingPointError):
    """Raised at the first overflow when raise_on_overflow is set."""


class OpOverflowCheck(OpTool):
    """range_dtype: also flag finite values whose magnitude exceeds this dtype's maximum (for
    example torch.float16 while running in float32). raise_on_overflow: raise at the first
    origin instead of recording and going on. max_events: origins kept after the first."""

    tool_name = "overflow check"

    def __init__(self, ops=None, *, range_dtype: torch.dtype | None = None, raise_on_overflow: bool = False,
                 max_events: int = 100, report: TextIO | None = STDERR, **filters):
        super().__init__(ops, **filters)
        self.limit = torch.finfo(range_dtype).max if range_dtype is not None else None
        self.range_name = str(range_dtype).replace("torch.", "") if range_dtype is not None else None
        self.raise_on_overflow = raise_on_overflow
        self.max_events = max_events
        self.report = report
        self.events: list[OverflowEvent] = []
        self.checked = 0

    @property
    def first(self) -> OverflowEvent | None:
        return self.events[0] if self.events else None

    def _problem(self, tensor: torch.Tensor) -> str | None:
        if not tensor.is_floating_point():
            return None
        with hidden():
            nan = bool(torch.isnan(tensor).any())
            inf = bool(torch.isinf(tensor).any())
            if nan or inf:
                return "+".join(kind for kind, present in (("nan", nan), ("inf", inf)) if present)
            if self.limit is not None and tensor.numel() and float(tensor.abs().max()) > self.limit:
                return f"beyond {self.range_name} range"
        return None

    def handle(self, call: OpCall):
        out = call.run()
        if returns_alias(call.func) or len(self.events) >= self.max_events:
            return out
        self.checked += 1
        for position, tensor in enumerate(tensors_of(out)):
            kind = self._problem(tensor)
            if kind is None:
                continue
            inputs = call.tensors
            if any(self._problem(t) for t in inputs):
                return out  # propagated, not produced here
            event = OverflowEvent(call.index, call.name, call.phase, call.module, kind, position,
                                  [tensor_stats(t) for t in inputs], tensor_stats(tensor))
            self.events.append(event)
            if len(self.events) == 1 and self.report is not None:
                print(event.describe(), file=self.report)
            if self.raise_on_overflow:
                raise OpOverflowError(event.describe())
            return out
        return out

    def on_stop(self) -> None:
        if self.report is not None:
            print(self.summary(), file=self.report)

    def summary(self) -> str:
        if not self.events:
            return f"overflow check: {self.checked} op calls checked, no overflow"
        first = self.first
        return (f"overflow check: {len(self.events)} op calls produced non-finite or out-of-range values from finite "
                f"inputs; first: call {first.index} {first.op} ({first.phase}) in {first.module or '<no module>'}")
