"""Pipeline traces in the Chrome trace-event format (JSON, opens in Perfetto and chrome://tracing): one
track per rank (process id = rank, named after its stage and chip), one complete event ("ph": "X") per
span, on one timeline in microseconds.

The runtime records what a rank did (heteropp.tracing); the simulator's predicted schedule is written
the same way (`heteroauto simulate --trace`), one track per stage, so predicted and measured open side
by side. Span kinds (the event's "cat"): forward, backward, backward-input, backward-weight, recompute,
send, recv, all-reduce, optimizer. Pure Python: must not import torch.
"""

from __future__ import annotations

import json
import os

from h2.core.errors import UserError

SPAN_KINDS = ("forward", "backward", "backward-input", "backward-weight", "recompute", "send", "recv", "all-reduce",
              "optimizer")


def span_event(name: str, kind: str, start_s: float, end_s: float, track: int, args: dict | None = None,
               lane: int = 0) -> dict:
    """One complete event on track `track` (a rank, or a stage of a simulation) from start_s to end_s;
    `lane` (the thread id) separates spans that overlap the track's compute (a simulated transfer)."""
    if kind not in SPAN_KINDS:
        raise ValueError(f"unknown span kind {kind!r} (known: {', '.join(SPAN_KINDS)})")
    event = {
        "name": name, "cat": kind, "ph": "X", "ts": start_s * 1e6, "dur": max(end_s - start_s, 0.0) * 1e6, "pid": track,
        "tid": lane
    }
    if args:
        event["args"] = args
    return event


def track_name_event(track: int, name: str) -> dict:
    """The metadata event that names a track, with its sort order (tracks sorted by rank)."""
    return {"name": "process_name", "ph": "M", "pid": track, "tid": 0, "args": {"name": name}}


def track_order_event(track: int) -> dict:
    return {"name": "process_sort_index", "ph": "M", "pid": track, "tid": 0, "args": {"sort_index": track}}


def write_trace(path: str, events: list[dict], metadata: dict | None = None) -> None:
    """Write a trace file (atomically: a reader never sees half a file)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.partial.{os.getpid()}"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": metadata or {}}, handle)
        os.replace(partial, path)
    except OSError as error:
        raise UserError(f"--trace {path}: cannot write ({error.strerror or error})") from None


def read_trace(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: not a readable trace ({getattr(error, 'strerror', None) or error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UserError(f"{path}: field 'traceEvents' missing (not a Chrome trace-event file)")
    return data


def merge_traces(paths: list[str], out: str) -> None:
    """One trace with every file's events (each rank keeps its own track)."""
    events: list[dict] = []
    for path in paths:
        events += read_trace(path)["traceEvents"]
    write_trace(out, events, {"merged_from": [os.path.basename(path) for path in paths]})
