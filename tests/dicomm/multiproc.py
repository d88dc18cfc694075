"""Runs one scenario of _worker.py in several local processes and collects their findings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = str(Path(__file__).with_name("_worker.py"))


def start_rank(scenario, rank, world_size, store_dir, transport="tcp", env=None, **args):
    environment = dict(os.environ)
    environment.update(env or {})
    return subprocess.Popen([sys.executable, WORKER, scenario, str(rank), str(world_size), store_dir, transport,
                             json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environment)


def finish(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"rank exited with {process.returncode} without a result; stderr:\n{err}")
    return json.loads(lines[-1])


def run_ranks(scenario, world_size=2, transport="tcp", timeout=120, env=None, **args):
    store_dir = tempfile.mkdtemp(prefix="dicomm-test-")
    processes = [start_rank(scenario, r, world_size, store_dir, transport, env, **args) for r in range(world_size)]
    return [finish(p, timeout) for p in processes]
