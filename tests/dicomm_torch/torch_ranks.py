"""Runs one job of _torch_worker.py as several local processes joined by env:// rendezvous."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = str(Path(__file__).with_name("_torch_worker.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(job: str, world_size: int, **args) -> list[subprocess.Popen]:
    environment = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size),
                       OMP_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, WORKER, job, json.dumps(args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(environment, RANK=str(rank)))
            for rank in range(world_size)]


def result_of(process: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"rank did not finish within {timeout} s; stderr:\n{err[-4000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"rank exited with {process.returncode} without a result; stderr:\n{err[-4000:]}")
    return json.loads(lines[-1])


def run_job(job: str, world_size: int, timeout: float = 90, **args) -> list[dict]:
    """Each rank's findings (a dict printed as its last line of JSON)."""
    processes = start_ranks(job, world_size, **args)
    return [result_of(p, timeout) for p in processes]
