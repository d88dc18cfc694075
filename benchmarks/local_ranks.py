"""Launching a benchmark's ranks as local processes: `main(rank, port, args, out_path)` runs in each,
rank 0 writes its result as JSON to `out_path`, and `run_local_ranks` returns that result."""

from __future__ import annotations

import json
import os
import socket
import tempfile

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_result(out_path: str, result) -> None:
    with open(out_path, "w") as handle:
        json.dump(result, handle)


def run_local_ranks(main, world: int, args, start_method: str = "spawn"):
    out_path = os.path.join(tempfile.mkdtemp(prefix="bench-"), "result.json")
    mp.start_processes(main, args=(free_port(), args, out_path), nprocs=world, join=True, start_method=start_method)
    with open(out_path) as handle:
        return json.load(handle)
