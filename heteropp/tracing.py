"""Recording what one rank did in a step as trace spans (h2.core.trace's format): forward, backward
(input and weight gradients in the split schedule), recompute, send, recv, all-reduce, optimizer.

Times are the wall clock (time.time), so every rank of the job lands on one timeline. A device that
queues kernels (an emulated chip, CUDA) would make a compute span only the time to enqueue it: the
recorder synchronises the device at the end of each compute span, as a profiler without device events
must (tracing costs that overlap of host and chip; the untraced run keeps it).
"""

from __future__ import annotations

import contextlib
import time

import torch

from h2.core.trace import span_event, track_name_event, track_order_event, write_trace

COMPUTE_SPANS = ("forward", "backward", "backward-input", "backward-weight", "recompute", "optimizer")


class SpanRecorder:

    def __init__(self, rank: int, label: str, device: torch.device):
        self.rank, self.label = rank, label
        module = getattr(torch, device.type, None)
        self._synchronize = getattr(module, "synchronize", None) if device.type != "cpu" else None
        self.events: list[dict] = []
        self.step = 0

    @contextlib.contextmanager
    def span(self, name: str, kind: str, **args):
        start = time.time()
        try:
            yield
        finally:
            if kind in COMPUTE_SPANS and self._synchronize is not None:
                self._synchronize()
            self.events.append(span_event(name, kind, start, time.time(), self.rank, {"step": self.step, **args}))

    def write(self, path: str) -> None:
        metadata = [track_name_event(self.rank, f"rank {self.rank}: {self.label}"), track_order_event(self.rank)]
        write_trace(path, metadata + self.events, {"rank": self.rank, "track": self.label, "source": "measured"})


def span(recorder: SpanRecorder | None, name: str, kind: str, **args):
    """The recorder's span, or nothing when the run is not traced."""
    return recorder.span(name, kind, **args) if recorder is not None else contextlib.nullcontext()
