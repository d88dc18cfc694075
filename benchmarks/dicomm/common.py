"""What the DiComm benchmarks share: round-trip timing between two ranks, the iteration budget per
message size, the rendezvous store, size formatting and the report (table, target lines, JSON)."""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from h2.core.errors import UserError

MAX_SIZE = 1 << 30  # the largest message size a benchmark takes (a buffer of it on each rank)


@dataclass(frozen=True)
class Iterations:
    """How many times a benchmark repeats a message size: `most` (`quick_most` under --quick), fewer for
    large sizes so that about `bytes_budget` bytes move, and never fewer than `least` (`quick_least`)."""
    most: int
    least: int
    bytes_budget: int
    quick_most: int = 50
    quick_least: int = 5


LATENCY_ITERATIONS = Iterations(most=2000, least=20, bytes_budget=2 << 30)


def iterations_for(size: int, quick: bool, budget: Iterations = LATENCY_ITERATIONS) -> int:
    top = budget.quick_most if quick else budget.most
    return max(min(top, budget.bytes_budget // max(size, 1)), budget.quick_least if quick else budget.least)


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
    return {
        "transport": transport, "bytes": size, "latency_us": one_way_s * 1e6,
        "bandwidth_GBps": size / one_way_s / 1e9 if one_way_s > 0 else 0.0
    }


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


def parse_sizes(text: str, flag: str) -> list[int]:
    """A comma-separated list of message sizes in bytes, each 1..MAX_SIZE."""
    try:
        sizes = [int(size) for size in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} {text}: not a comma-separated list of byte counts") from None
    if any(not 1 <= size <= MAX_SIZE for size in sizes):
        raise UserError(f"{flag} {text}: message sizes must be between 1 and {MAX_SIZE} bytes (1 GiB)")
    return sizes


def check_output_file(path: str | None, flag: str) -> None:
    """Refuse, before the benchmark runs, an output file that could not be written after it."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"{flag} {path}: is a folder")
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {path}: no folder {folder}")
    writable = os.access(path, os.W_OK) if os.path.exists(path) else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise UserError(f"{flag} {path}: not writable")


def check_congestion_control(name: str) -> None:
    """Refuse, before any rank starts, a DICOMM_TCP_CONGESTION the kernel would refuse the ranks' sockets."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
        except OSError as error:
            raise UserError(f"DICOMM_TCP_CONGESTION={name}: refused by the kernel ({error.strerror})") from None


def report(rows: list[dict], table: str, targets: list[str], json_path: str | None) -> int:
    """Print the table and the PASS/FAIL lines; with --json, also write {'rows': [...]} to the file.
    The exit status: 1 when a target failed, else 0."""
    print(table)
    print()
    for line in targets:
        print(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 1 if any(line.startswith("FAIL") for line in targets) else 0
