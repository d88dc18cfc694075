"""python benchmarks/dicomm/bench.py --torch: the dicomm torch.distributed backend against gloo, same run.

Measured through the public torch.distributed API, in the same processes for both backends
(the default group is dicomm, a gloo group spans the same ranks):
- dist.send/recv ping-pong between two processes: one-way latency is half the median round trip,
  bandwidth is bytes / one-way latency;
- batch_isend_irecv: both ranks exchange a tensor in one batch; median time per exchange;
- all_reduce (sum, float32) over --world processes: median time per call and bus bandwidth
  2 (n - 1) / n * bytes / time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import Iterations, check_output_file, human, iterations_for, parse_sizes, rendezvous_store, report
from h2.core.errors import UserError
from h2.core.ranks import run_ranks

P2P_SIZES = [8, 4096, 256 << 10, 4 << 20, 64 << 20]
QUICK_P2P_SIZES = [4096, 1 << 20]
ALLREDUCE_SIZES = [4096, 1 << 20, 64 << 20]
QUICK_ALLREDUCE_SIZES = [1 << 20]
ITERATIONS = Iterations(most=1000, least=10, bytes_budget=1 << 30, quick_least=3)


def timed(fn, iterations: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + iterations):
        start = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def p2p_worker(rank: int, world: int, sizes: list[int], quick: bool) -> list[dict] | None:
    """One of the two ping-pong processes; rank 0 returns every row."""
    import torch
    import torch.distributed as dist

    import dicomm  # noqa: F401

    store = rendezvous_store(rank, world, timeout_s=120)
    dist.init_process_group("dicomm", store=dist.PrefixStore("bench-torch-p2p", store), rank=rank, world_size=world)
    groups = {"dicomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    peer = 1 - rank
    rows = []
    for size in sizes:
        n = iterations_for(size, quick, ITERATIONS)
        for name, group in groups.items():
            buffer = torch.zeros(size, dtype=torch.uint8)
            incoming = torch.zeros(size, dtype=torch.uint8)

            def ping_pong():
                if rank == 0:
                    dist.send(buffer, peer, group=group)
                    dist.recv(buffer, peer, group=group)
                else:
                    dist.recv(buffer, peer, group=group)
                    dist.send(buffer, peer, group=group)

            def exchange():
                ops = [dist.P2POp(dist.isend, buffer, peer, group), dist.P2POp(dist.irecv, incoming, peer, group)]
                for work in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
                    work.wait()

            dist.barrier(group=group)
            round_trips = timed(ping_pong, n, max(n // 10, 2))
            dist.barrier(group=group)
            exchanges = timed(exchange, n, max(n // 10, 2))
            if rank == 0:
                one_way = statistics.median(round_trips) / 2
                rows.append({
                    "test": "send/recv", "backend": name, "bytes": size, "latency_us": one_way * 1e6,
                    "bandwidth_GBps": size / one_way / 1e9
                })
                per_exchange = statistics.median(exchanges)
                rows.append({
                    "test": "batch_isend_irecv", "backend": name, "bytes": size, "latency_us": per_exchange * 1e6,
                    "bandwidth_GBps": size / per_exchange / 1e9
                })
    dist.destroy_process_group()
    return rows if rank == 0 else None


def allreduce_worker(rank: int, world: int, sizes: list[int], quick: bool) -> list[dict] | None:
    """One of the all_reduce processes; rank 0 returns every row."""
    import torch
    import torch.distributed as dist

    import dicomm  # noqa: F401

    store = rendezvous_store(rank, world, timeout_s=300)
    dist.init_process_group("dicomm", store=dist.PrefixStore("bench-torch-ar", store), rank=rank, world_size=world)
    groups = {"dicomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rows = []
    for size in sizes:
        n = max(min(200 if not quick else 20, (4 << 30) // size), 5 if not quick else 3)
        for name, group in groups.items():
            tensor = torch.ones(size // 4, dtype=torch.float32)
            dist.barrier(group=group)
            times = timed(lambda: dist.all_reduce(tensor, group=group), n, 2)
            if rank == 0:
                t = statistics.median(times)
                rows.append({
                    "test": f"all_reduce x{world}", "backend": name, "bytes": size, "latency_us": t * 1e6,
                    "bandwidth_GBps": 2 * (world - 1) / world * size / t / 1e9
                })
    dist.destroy_process_group()
    return rows if rank == 0 else None


def spawn(target, world: int, *args) -> list[dict]:
    """The rows rank 0 of `target` measured over `world` local processes."""
    return run_ranks(target, world, args, timeout=1800)[0]


def format_table(rows: list[dict]) -> str:
    by = {(r["test"], r["backend"], r["bytes"]): r for r in rows}
    lines = [
        f"{'test':<18} {'size':>8} {'dicomm us':>11} {'gloo us':>11} {'dicomm GB/s':>12} {'gloo GB/s':>10} "
        f"{'time dicomm/gloo':>17}"
    ]
    for test in dict.fromkeys(r["test"] for r in rows):
        for size in sorted({r["bytes"] for r in rows if r["test"] == test}):
            ours, gloo = by[(test, "dicomm", size)], by[(test, "gloo", size)]
            lines.append(f"{test:<18} {human(size):>8} {ours['latency_us']:11.1f} {gloo['latency_us']:11.1f} "
                         f"{ours['bandwidth_GBps']:12.3f} {gloo['bandwidth_GBps']:10.3f} "
                         f"{ours['latency_us'] / gloo['latency_us']:17.3f}")
    return "\n".join(lines)


def check_targets(rows: list[dict], world: int) -> list[str]:
    """The backend issue's targets, each as one PASS/FAIL line (only where measured)."""
    by = {(r["test"], r["backend"], r["bytes"]): r for r in rows}
    lines = []
    small, large = 4096, 64 << 20
    if ("send/recv", "dicomm", small) in by:
        ratio = by[("send/recv", "dicomm", small)]["latency_us"] / by[("send/recv", "gloo", small)]["latency_us"]
        lines.append(f"{'PASS' if ratio <= 0.2 else 'FAIL'} send/recv 4 KiB latency dicomm/gloo = {ratio:.3f} "
                     "(target <= 0.2)")
    if ("send/recv", "dicomm", large) in by:
        ratio = by[("send/recv", "dicomm", large)]["bandwidth_GBps"] / by[("send/recv", "gloo",
                                                                           large)]["bandwidth_GBps"]
        lines.append(f"{'PASS' if ratio >= 2 else 'FAIL'} send/recv 64 MiB bandwidth dicomm/gloo = {ratio:.2f} "
                     "(target >= 2)")
    test = f"all_reduce x{world}"
    if (test, "dicomm", large) in by:
        ratio = by[(test, "gloo", large)]["latency_us"] / by[(test, "dicomm", large)]["latency_us"]
        lines.append(f"{'PASS' if ratio >= 1 else 'FAIL'} all_reduce 64 MiB over {world} processes, speed dicomm/gloo "
                     f"= {ratio:.2f} (target >= 1)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/dicomm/bench.py --torch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few sizes and iterations (smoke test)")
    parser.add_argument("--json", metavar="FILE", help="also write {'rows': [...]} to FILE")
    parser.add_argument("--sizes", help="comma-separated send/recv sizes in bytes (overrides the default set)")
    parser.add_argument("--allreduce-sizes", help="comma-separated all_reduce sizes in bytes")
    parser.add_argument("--world", type=int, default=4, help="processes for all_reduce (default 4)")
    args = parser.parse_args(argv)
    p2p_sizes = parse_sizes(args.sizes,
                            "--sizes") if args.sizes is not None else (QUICK_P2P_SIZES if args.quick else P2P_SIZES)
    ar_sizes = (parse_sizes(args.allreduce_sizes, "--allreduce-sizes") if args.allreduce_sizes is not None else
                (QUICK_ALLREDUCE_SIZES if args.quick else ALLREDUCE_SIZES))
    if not 1 <= args.world <= 64:
        raise UserError(f"--world must be between 1 and 64, got {args.world}")
    check_output_file(args.json, "--json")
    rows = spawn(p2p_worker, 2, p2p_sizes, args.quick) if p2p_sizes else []
    if ar_sizes and args.world > 1:
        rows += spawn(allreduce_worker, args.world, ar_sizes, args.quick)
    return report(rows, format_table(rows), check_targets(rows, args.world), args.json)


if __name__ == "__main__":
    sys.exit(main())
