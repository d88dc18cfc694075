"""python benchmarks/dicomm/bench.py: DiComm transports against torch.distributed gloo and memcpy.

Two local processes ping-pong messages of each size. One-way latency is half the median round
trip; bandwidth is bytes / one-way latency. gloo send/recv is measured the same way in the same
run, and a plain memcpy of the same sizes (one process) bounds what any same-host path can do.
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import bench_device
import bench_torch
from common import (
    check_congestion_control,
    check_output_file,
    human,
    iterations_for,
    parse_sizes,
    ping_pong,
    rendezvous_store,
    report,
    row,
)
from dicomm import _dicomm_core as _core
from dicomm.endpoint import Endpoint, probe_ibverbs
from h2.core.errors import ArgumentParser, UserError, run_cli
from h2.core.ranks import run_ranks

FULL_SIZES = [8, 64, 512, 4096, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [8, 4096, 1 << 20]
TCP_OVER_GLOO_TARGET = 1.2  # issue 17: tcp at least 1.2x gloo's bandwidth at 1, 16 and 64 MiB


def worker(rank: int, world_size: int, transports: list[str], sizes: list[int], quick: bool) -> list[dict] | None:
    """One of the two ping-pong processes; rank 0 returns every row."""
    import torch
    import torch.distributed as dist

    store = rendezvous_store(rank, world_size, timeout_s=120)
    peer = 1 - rank
    rows = []
    for transport in transports:
        endpoint = Endpoint(store, rank, 2, transport=transport, prefix=f"bench/{transport}", timeout=120)
        for size in sizes:
            buffer = np.zeros(size, np.uint8)
            n = iterations_for(size, quick)
            times = ping_pong(lambda b: endpoint.send(b, peer), lambda b: endpoint.recv(b, peer), rank, buffer, n,
                              warmup=max(n // 10, 2))
            if rank == 0:
                rows.append(row(transport, size, statistics.median(times) / 2))
        endpoint.close()

    dist.init_process_group("gloo", store=dist.PrefixStore("bench/gloo", store), rank=rank, world_size=2)
    for size in sizes:
        tensor = torch.zeros(size, dtype=torch.uint8)
        n = iterations_for(size, quick)
        times = ping_pong(lambda t: dist.send(t, peer), lambda t: dist.recv(t, peer), rank, tensor, n, warmup=max(
            n // 10, 2))
        if rank == 0:
            rows.append(row("gloo", size, statistics.median(times) / 2))
    dist.destroy_process_group()

    if rank == 0:
        for size in sizes:
            source, target = np.ones(size, np.uint8), np.zeros(size, np.uint8)
            n = iterations_for(size, quick)
            copies = []
            for i in range(n + 2):
                start = time.perf_counter()
                np.copyto(target, source)
                if i >= 2:
                    copies.append(time.perf_counter() - start)
            rows.append(row("memcpy", size, statistics.median(copies)))
        return rows
    return None


def run(transports: list[str], sizes: list[int], quick: bool) -> list[dict]:
    return run_ranks(worker, 2, (transports, sizes, quick), timeout=1800)[0]


def format_table(rows: list[dict]) -> str:
    by = {(r["transport"], r["bytes"]): r for r in rows}
    names = [t for t in ("shm", "ibverbs", "tcp", "gloo", "memcpy") if any(r["transport"] == t for r in rows)]
    sizes = sorted({r["bytes"] for r in rows})
    lines = ["one-way latency (us), half the median round trip; memcpy: one copy"]
    lines.append(f"{'size':>8} " + " ".join(f"{n:>9}"
                                            for n in names) + "".join(f" {n + '/gloo':>10}"
                                                                      for n in names if n not in ("gloo", "memcpy")))
    for s in sizes:
        gloo = by.get(("gloo", s))
        cells = " ".join(f"{by[(n, s)]['latency_us']:9.2f}" for n in names)
        ratios = "".join(f" {by[(n, s)]['latency_us'] / gloo['latency_us']:10.3f}" for n in names
                         if n not in ("gloo", "memcpy") and gloo)
        lines.append(f"{human(s):>8} {cells}{ratios}")
    lines.append("")
    lines.append("bandwidth (GB/s) = bytes / one-way latency")
    lines.append(f"{'size':>8} " + " ".join(f"{n:>9}"
                                            for n in names) + "".join(f" {n + '/gloo':>10}"
                                                                      for n in names if n not in ("gloo", "memcpy")) +
                 "".join(f" {n + '/memcpy':>12}" for n in names if n not in ("gloo", "memcpy")))
    for s in sizes:
        gloo, memcpy = by.get(("gloo", s)), by.get(("memcpy", s))
        cells = " ".join(f"{by[(n, s)]['bandwidth_GBps']:9.3f}" for n in names)
        vs_gloo = "".join(f" {by[(n, s)]['bandwidth_GBps'] / gloo['bandwidth_GBps']:10.2f}" for n in names
                          if n not in ("gloo", "memcpy") and gloo)
        vs_memcpy = "".join(f" {by[(n, s)]['bandwidth_GBps'] / memcpy['bandwidth_GBps']:12.2f}" for n in names
                            if n not in ("gloo", "memcpy") and memcpy)
        lines.append(f"{human(s):>8} {cells}{vs_gloo}{vs_memcpy}")
    return "\n".join(lines)


def check_targets(rows: list[dict]) -> list[str]:
    """The issue's performance targets, each as one PASS/FAIL line (only where measured)."""
    by = {(r["transport"], r["bytes"]): r for r in rows}
    lines = []
    small, large = 4096, 64 << 20
    if ("shm", small) in by and ("gloo", small) in by:
        ratio = by[("shm", small)]["latency_us"] / by[("gloo", small)]["latency_us"]
        lines.append(f"{'PASS' if ratio <= 0.1 else 'FAIL'} shm 4 KiB latency / gloo = {ratio:.3f} (target <= 0.1)")
    if ("shm", large) in by and ("gloo", large) in by and ("memcpy", large) in by:
        vs_gloo = by[("shm", large)]["bandwidth_GBps"] / by[("gloo", large)]["bandwidth_GBps"]
        vs_memcpy = by[("shm", large)]["bandwidth_GBps"] / by[("memcpy", large)]["bandwidth_GBps"]
        lines.append(f"{'PASS' if vs_gloo >= 2 else 'FAIL'} shm 64 MiB bandwidth / gloo = {vs_gloo:.2f} (target >= 2)")
        lines.append(f"{'PASS' if vs_memcpy >= 0.5 else 'FAIL'} shm 64 MiB bandwidth / memcpy = {vs_memcpy:.2f} "
                     "(target >= 0.5)")
    tcp_sizes = sorted(s for (t, s) in by if t == "tcp" and ("gloo", s) in by)
    if tcp_sizes:
        worst = min(tcp_sizes, key=lambda s: by[("tcp", s)]["bandwidth_GBps"] / by[("gloo", s)]["bandwidth_GBps"])
        ratio = by[("tcp", worst)]["bandwidth_GBps"] / by[("gloo", worst)]["bandwidth_GBps"]
        lines.append(f"{'PASS' if ratio >= TCP_OVER_GLOO_TARGET else 'FAIL'} tcp bandwidth / gloo at every size: "
                     f"worst {ratio:.2f} at {human(worst)} (target >= {TCP_OVER_GLOO_TARGET})")
    return lines


def _check_environment(transports: list[str], sizes: list[int]) -> None:
    """The DICOMM_* variables the workers will read, checked before any worker starts."""
    try:
        options = _core.Options.from_environment()
        options.validate()
    except ValueError as error:
        raise UserError(str(error)) from None
    if options.max_message_bytes < max(sizes):
        raise UserError(f"DICOMM_MAX_MESSAGE_BYTES={options.max_message_bytes} is below the largest message size "
                        f"{max(sizes)}: the receiving rank would refuse it")
    if "tcp" in transports and options.tcp_congestion not in ("", "auto"):
        check_congestion_control(options.tcp_congestion)


@run_cli("dicomm.bench")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--device" or a.startswith("--device=") for a in argv):  # device tensors (bench_device.py)
        return bench_device.main(argv)
    if "--torch" in argv:  # the torch.distributed backend against gloo (bench_torch.py)
        return bench_torch.main([a for a in argv if a != "--torch"])
    parser = ArgumentParser(prog="python benchmarks/dicomm/bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few sizes and iterations (smoke test)")
    parser.add_argument("--json", metavar="FILE", help="also write {'rows': [...]} to FILE")
    parser.add_argument("--sizes", help="comma-separated message sizes in bytes (overrides the default set)")
    parser.add_argument("--transports", help="comma-separated subset of shm,tcp,ibverbs (default: all available)")
    args = parser.parse_args(argv)

    available = ["shm", "tcp"] + (["ibverbs"] if probe_ibverbs()["available"] else [])
    transports = args.transports.split(",") if args.transports else available
    for t in transports:
        if t not in available:
            print(f"dicomm.bench: transport '{t}' is not available here ({probe_ibverbs()['message']})",
                  file=sys.stderr)
            return 2
    if args.sizes is not None:
        sizes = parse_sizes(args.sizes, "--sizes")
    else:
        sizes = QUICK_SIZES if args.quick else FULL_SIZES
    _check_environment(transports, sizes)
    check_output_file(args.json, "--json")
    if "ibverbs" not in available:
        print(probe_ibverbs()["message"])
    rows = run(transports, sizes, args.quick)
    return report(rows, format_table(rows), check_targets(rows), args.json)


if __name__ == "__main__":
    sys.exit(main())
