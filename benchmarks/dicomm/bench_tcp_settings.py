"""DiComm tcp under different settings against gloo, interleaved in one run.

    .venv/bin/python benchmarks/dicomm/bench_tcp_settings.py [--sizes 1048576,16777216,67108864] [--rounds 3]
        [--setting NAME=VAR=VALUE,VAR=VALUE ...]

Two local processes open one tcp Endpoint per setting (each created with its DICOMM_* variables
set, so every setting keeps its own sockets) and one gloo group. Each round ping-pongs every size
over gloo and then over each setting, so a neighbour's load falls on all of them alike; per size it
prints the median over the rounds of each one's one-way bandwidth (half the median round trip, as
`python benchmarks/dicomm/bench.py`), its ratio to gloo's and the per-round values. Without --setting it
compares the settings before issue 17's tcp work ("before": the kernel's congestion control, no
not-sent limit, no spinning) with the defaults ("now").
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from common import iterations_for, parse_sizes, ping_pong, rendezvous_store
from h2.core.ranks import run_ranks

DEFAULT_SETTINGS = {
    "before": {"DICOMM_TCP_CONGESTION": "default", "DICOMM_TCP_NOTSENT_LOWAT_BYTES": "0", "DICOMM_SPIN_US": "0"},
    "now": {},
}
ROUND_TRIPS_DIVISOR = 4  # each round runs a quarter of dicomm.bench's round trips (at least 20)


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition("=")
    variables = dict(item.split("=", 1) for item in assignments.split(",") if item)
    if not name or not all(variable.startswith("DICOMM_") for variable in variables):
        raise argparse.ArgumentTypeError(f"--setting {text}: expected NAME=DICOMM_VAR=VALUE,DICOMM_VAR=VALUE")
    return name, variables


def endpoint_with(store, rank: int, prefix: str, variables: dict[str, str]):
    from dicomm.endpoint import Endpoint

    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        return Endpoint(store, rank, 2, transport="tcp", prefix=prefix, timeout=120)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def worker(rank: int, world_size: int, sizes: list[int], rounds: int, settings: dict) -> dict | None:
    import torch
    import torch.distributed as dist

    store = rendezvous_store(rank, world_size, timeout_s=120)
    peer = 1 - rank
    endpoints = {
        name: endpoint_with(store, rank, f"settings/{name}", variables) for name, variables in settings.items()
    }
    dist.init_process_group("gloo", store=dist.PrefixStore("settings/gloo", store), rank=rank, world_size=2)
    one_way: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for size in sizes:
            n = iterations_for(size, False) // ROUND_TRIPS_DIVISOR + 20
            tensor = torch.zeros(size, dtype=torch.uint8)
            times = ping_pong(lambda t: dist.send(t, peer), lambda t: dist.recv(t, peer), rank, tensor, n, 5)
            one_way.setdefault(("gloo", size), []).append(statistics.median(times or [0.0]) / 2)
            buffer = np.zeros(size, np.uint8)
            for name, endpoint in endpoints.items():
                times = ping_pong(lambda b: endpoint.send(b, peer), lambda b: endpoint.recv(b, peer), rank, buffer, n,
                                  5)
                one_way.setdefault((name, size), []).append(statistics.median(times or [0.0]) / 2)
    for endpoint in endpoints.values():
        endpoint.close()
    dist.destroy_process_group()
    return one_way if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1048576,16777216,67108864")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--setting", type=parse_setting, action="append", default=[])
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes, "--sizes")
    settings = dict(args.setting) or DEFAULT_SETTINGS
    load_before = os.getloadavg()[0]
    one_way = run_ranks(worker, 2, (sizes, args.rounds, settings), timeout=1800)[0]
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'size':>10} {'path':>8} {'GB/s':>7} {'/gloo':>6}  per round GB/s")
    for size in sizes:
        gloo = statistics.median(one_way[("gloo", size)])
        for name in ["gloo", *settings]:
            seconds = one_way[(name, size)]
            median = statistics.median(seconds)
            rounds = " ".join(f"{size / s / 1e9:.2f}" for s in seconds)
            print(f"{size:>10} {name:>8} {size / median / 1e9:7.2f} {gloo / median:6.2f}  {rounds}")


if __name__ == "__main__":
    main()
