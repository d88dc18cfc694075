"""What the DiComm benchmarks share: round-trip timing between two ranks, the iteration budget per
message size, the rendezvous store, size formatting and the report (table, target lines, JSON)."""
from __future__ import annotations

import json
import os
import time

LATENCY_ITERATIONS = 2000
QUICK_ITERATIONS = 50
BYTES_BUDGET_PER_SIZE = 2 << 30  # large sizes run fewer round trips (at least MIN_ITERATIONS)
MIN_ITERATIONS = 20


def iterations_for(size: int, quick: bool) -> int:
    top = QUICK_ITERATIONS if quick else LATENCY_ITERATIONS
    return max(min(top, BYTES_BUDGET_PER_SIZE // max(size, 1)), 5 if quick else MIN_ITERATIONS)


def ping_pong(send, recv, rank: int, buffer, iterations: int, warmup: int) -> list[float]:
    """Round-trip times in seconds as seen by rank 0."""
    round_trips = []
    for i in range(warmup + iterations):
        if rank == 0:
            start = time.perf_counter()
            send(buffer)
            recv(buffer)
            if i >= warmup:
                round_trips.append(time.perf_counter() - start)
        else:
            recv(buffer)
            send(buffer)
    return round_trips


def row(transport: str, size: int, one_way_s: float) -> dict:
    return {"transport": transport, "bytes": size, "latency_us": one_way_s * 1e6,
            "bandwidth_GBps": size / one_way_s / 1e9 if one_way_s > 0 else 0.0}


def rendezvous_store(rank: int, world_size: int, timeout_s: float):
    """The job's torch.distributed TCPStore at MASTER_ADDR:MASTER_PORT (set by h2.core.ranks), hosted by rank 0."""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=rank == 0,
                         timeout=datetime.timedelta(seconds=timeout_s))


def human(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def report(rows: list[dict], table: str, targets: list[str], json_path: str | None) -> None:
    """Print the table and the PASS/FAIL lines; with --json, also write {'rows': [...]} to the file."""
    print(table)
    print()
    for line in targets:
        print(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
