"""Dtype cast: selected ops run in a higher precision; outputs are cast back to the dtype the
call's inputs had, so the rest of the program sees the dtypes it expects."""

from __future__ import annotations

from typing import TextIO

import torch

from ditorch.op_tools.converted_call import run_converted
from ditorch.op_tools.tensors import STDERR
from ditorch.op_tools.tool import OpCall, OpTool, returns_alias

DEFAULT_CASTS = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def parse_casts(text: str) -> dict[torch.dtype, torch.dtype]:
    """'bfloat16:float32,float16:float32' -> {torch.bfloat16: torch.float32, torch.float16: torch.float32}."""
    casts = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        source, _, target = item.partition(":")
        dtypes = [getattr(torch, name.strip(), None) for name in (source, target)]
        if not target or not all(isinstance(d, torch.dtype) and d.is_floating_point for d in dtypes):
            raise ValueError(f"dtype cast {item!r}: expected FROM:TO with floating dtypes, e.g. bfloat16:float32")
        casts[dtypes[0]] = dtypes[1]
    return casts


class OpDtypeCast(OpTool):
    tool_name = "dtype cast"

    def __init__(self, ops=None, *, casts: dict[torch.dtype, torch.dtype] | None = None, report: TextIO | None = STDERR,
                 **filters):
        super().__init__(ops, **filters)
        self.casts = DEFAULT_CASTS if casts is None else dict(casts)
        self.report = report
        self.counts: dict[str, int] = {}

    def handle(self, call: OpCall):
        cast_from = [t.dtype for t in call.tensors if t.dtype in self.casts]
        if not cast_from or returns_alias(call.func):
            return call.run()
        original, wide = cast_from[0], self.casts[cast_from[0]]
        self.counts[call.name] = self.counts.get(call.name, 0) + 1
        return run_converted(call, convert=lambda t: t.to(self.casts.get(t.dtype, t.dtype)),
                             convert_back=lambda t: t.to(original) if t.dtype == wide else t)

    def on_stop(self) -> None:
        if self.report is not None:
            casts = ", ".join(f"{a}->{b}".replace("torch.", "") for a, b in self.casts.items())
            ops = ", ".join(f"{op} x{n}" for op, n in self.counts.items()) or "none"
            print(f"dtype cast ({casts}): {sum(self.counts.values())} op calls ran widened ({ops})", file=self.report)
