"""python benchmarks/dicomm/bench.py --device dipu [--torch]: device-direct against CPU-mediated, same run.

Two local processes ping-pong device tensors (dipu on the host vendor: an emulated chip whose
`discrete` profile keeps device memory out of the CPU's reach). CPU-mediated stages every message
through host memory with the vendor's copies (device -> host before the send, host -> device after
the receive); device-direct moves it through the vendor's registered memory with one copy. Both
paths run in the same processes, their round trips interleaved per size, through dicomm.Endpoint
or (--torch) through dist.send/recv on two dicomm process groups, one with DICOMM_DEVICE_DIRECT=0.
One-way latency is half the median round trip; bandwidth is bytes / one-way latency.
"""
from __future__ import annotations

import argparse
import os
import statistics

from common import check_output_file, human, iterations_for, parse_sizes, ping_pong, rendezvous_store, report
from h2.core.ranks import run_ranks

SIZES = [4096, 1 << 20, 64 << 20]
QUICK_SIZES = [4096, 1 << 20]
MODES = ("cpu-mediated", "device-direct")
ROUNDS = 3  # each size alternates the two modes this many times


def _device_tensor(device: str, size: int):
    import torch

    return torch.zeros(size, dtype=torch.uint8, device=device)


def _endpoint_transfers(rank: int, device: str, store, peer: int):
    """(send, recv) per mode over dicomm.Endpoint, on a device tensor's (address, nbytes)."""
    from dicomm.endpoint import Endpoint
    from h2.core import devices

    functions = devices.device_memory(device)
    transfers = {}
    for mode in MODES:
        endpoint = Endpoint(store, rank, 2, transport="shm", prefix=f"bench-device/{mode}", timeout=300,
                            device_memory=functions, device_direct=mode == "device-direct")
        if endpoint.device_direct(peer) != (mode == "device-direct"):
            raise RuntimeError(f"{mode}: the endpoint did not agree on device-direct with rank {peer}")
        transfers[mode] = (lambda region, e=endpoint: e.send(region, peer, device=True),
                           lambda region, e=endpoint: e.recv(region, peer, device=True))
    return transfers


def _torch_transfers(rank: int, store, peer: int):
    """(send, recv) per mode over dist.send/recv on two dicomm groups."""
    import torch.distributed as dist

    import dicomm  # noqa: F401  (registers the backend)

    os.environ["DICOMM_DEVICE_DIRECT"] = "0"
    dist.init_process_group("dicomm", store=dist.PrefixStore("bench-device-torch", store), rank=rank, world_size=2)
    os.environ["DICOMM_DEVICE_DIRECT"] = "1"
    groups = {"cpu-mediated": dist.group.WORLD, "device-direct": dist.new_group(backend="dicomm")}
    return {
        mode: (lambda t, g=group: dist.send(t, peer, group=g), lambda t, g=group: dist.recv(t, peer, group=g))
        for mode, group in groups.items()
    }


def worker(rank: int, world: int, device: str, sizes: list[int], quick: bool, through_torch: bool) -> list[dict] | None:
    """One of the two ping-pong processes; rank 0 returns every row."""
    from h2.core import devices

    devices.resolve_device(device)  # registers the device type (dipu: imports ditorch.dipu)
    store = rendezvous_store(rank, world, timeout_s=300)
    peer = 1 - rank
    transfers = _torch_transfers(rank, store, peer) if through_torch else _endpoint_transfers(rank, device, store, peer)
    rows = []
    for size in sizes:
        tensor = _device_tensor(device, size)
        buffer = tensor if through_torch else (tensor.data_ptr(), tensor.nbytes)
        n = max(iterations_for(size, quick) // ROUNDS, 3)
        times = {mode: [] for mode in MODES}
        for _ in range(ROUNDS):
            for mode in MODES:
                send, recv = transfers[mode]
                times[mode] += ping_pong(send, recv, rank, buffer, n, warmup=max(n // 10, 2))
        if rank == 0:
            for mode in MODES:
                one_way = statistics.median(times[mode]) / 2
                rows.append({
                    "transport": mode, "bytes": size, "latency_us": one_way * 1e6,
                    "bandwidth_GBps": size / one_way / 1e9
                })
    if through_torch:
        import torch.distributed as dist

        dist.destroy_process_group()
    return rows if rank == 0 else None


def format_table(rows: list[dict], title: str) -> str:
    by = {(r["transport"], r["bytes"]): r for r in rows}
    lines = [
        title, f"{'size':>8} {'mediated us':>12} {'direct us':>10} {'latency direct/mediated':>24} "
        f"{'mediated GB/s':>14} {'direct GB/s':>12} {'bandwidth direct/mediated':>26}"
    ]
    for size in sorted({r["bytes"] for r in rows}):
        mediated, direct = by[("cpu-mediated", size)], by[("device-direct", size)]
        lines.append(f"{human(size):>8} {mediated['latency_us']:12.1f} {direct['latency_us']:10.1f} "
                     f"{direct['latency_us'] / mediated['latency_us']:24.3f} {mediated['bandwidth_GBps']:14.3f} "
                     f"{direct['bandwidth_GBps']:12.3f} {direct['bandwidth_GBps'] / mediated['bandwidth_GBps']:26.2f}")
    return "\n".join(lines)


def check_targets(rows: list[dict], what: str) -> list[str]:
    by = {(r["transport"], r["bytes"]): r for r in rows}
    lines = []
    small, large = 4096, 64 << 20
    if ("device-direct", small) in by:
        ratio = by[("device-direct", small)]["latency_us"] / by[("cpu-mediated", small)]["latency_us"]
        lines.append(f"{'PASS' if ratio <= 0.5 else 'FAIL'} {what} 4 KiB latency device-direct/cpu-mediated = "
                     f"{ratio:.3f} (target <= 0.5)")
    if ("device-direct", large) in by:
        ratio = by[("device-direct", large)]["bandwidth_GBps"] / by[("cpu-mediated", large)]["bandwidth_GBps"]
        lines.append(f"{'PASS' if ratio >= 2 else 'FAIL'} {what} 64 MiB bandwidth device-direct/cpu-mediated = "
                     f"{ratio:.2f} (target >= 2)")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/dicomm/bench.py --device",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="device type of the tensors (dipu)")
    parser.add_argument("--torch", action="store_true", help="through dist.send/recv on the dicomm backend")
    parser.add_argument("--profile", default="discrete",
                        help="host vendor emulation profile of the dipu device (default discrete)")
    parser.add_argument("--quick", action="store_true", help="few sizes and iterations (smoke test)")
    parser.add_argument("--sizes", help="comma-separated message sizes in bytes")
    parser.add_argument("--json", metavar="FILE", help="also write {'rows': [...]} to FILE")
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes, "--sizes") if args.sizes is not None else (QUICK_SIZES if args.quick else SIZES)
    check_output_file(args.json, "--json")
    what = "dist.send/recv" if args.torch else "Endpoint"
    env = {"DIPU_HOST_PROFILE": args.profile, "OMP_NUM_THREADS": "1"}
    rows = run_ranks(worker, 2, (args.device, sizes, args.quick, args.torch), env=env, timeout=1800)[0]
    title = (f"{what}: {args.device} tensors (emulated chip: host vendor, profile '{args.profile}', whose emulated "
             "host link sets what each host<->device and peer copy costs: docs/dipu.md) between two processes; "
             "one-way latency = half the median round trip; every number below depends on the emulation")
    return report(rows, format_table(rows, title), check_targets(rows, what), args.json)
