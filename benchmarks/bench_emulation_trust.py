"""Does an emulated chip's step time depend on the chip, or on how many processes share the host?

    .venv/bin/python benchmarks/bench_emulation_trust.py [--speed 0.1] [--iterations 20]

One emulated chip (the DIPU host vendor at --speed of a host core) trains one decoder layer of the
`small` model (forward + backward of one micro-batch of 1 x 128 tokens, synchronised each iteration);
the median iteration time is measured
  alone;
  beside 3 ranks of the same emulated chip doing the same (a job of 4 such ranks: within the trust rule
  of h2.core.emulation while 4 x speed <= 0.5 x the host's cores);
  beside 3 unemulated processes that keep a core busy each (outside the rule: the host is oversubscribed);
and, as the baseline, the same three runs of the layer on the host itself (no emulation, speed 1), whose
time depends on the neighbours. Also the chip at half the speed, alone: its time should double. Printed:
medians, their ratio to the run alone, and the share of emulated kernel time the host made late.
Every run starts its processes through h2.core.ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from h2.core.ranks import run_ranks


def _chip_rank(rank: int, world_size: int, speed: float | None, iterations: int, stop_file: str, directory: str,
               measures: bool) -> dict | None:
    """An emulated chip at `speed` (None: the host's CPU itself) training one layer; or, when not
    `measures` and speed is None, a process that only keeps a core busy until the measurement ends."""
    import torch

    torch.set_num_threads(1)
    if not measures and speed is None:
        a = torch.randn(256, 256)
        while not os.path.exists(stop_file):
            a @ a
        return None
    device = "cpu"
    if speed is not None:
        from ditorch.dipu.emulation import emulate_chip

        emulate_chip({"name": f"chip-{rank}", "device_count": 1, "relative_speed": speed}, directory)
        device = "dipu"
    from h2.core.model_config import preset
    from h2.model.transformer import DecoderLayer

    layer = DecoderLayer(preset("small")).to(device)
    hidden = torch.randn(1, 128, 256, device=device, requires_grad=True)
    grad = torch.randn(1, 128, 256, device=device)

    def iteration() -> float:
        started = time.perf_counter()
        layer(hidden).backward(grad)
        hidden.grad[0, 0, 0].item()  # wait for the chip
        return time.perf_counter() - started

    for _ in range(3):
        iteration()
    times = [iteration() for _ in range(iterations)]
    if measures:
        open(stop_file, "w").close()
    stats = getattr(getattr(torch, device, None), "pacing_stats", lambda: None)() or {}
    late = stats.get("overrun_s", 0.0) / stats["emulated_s"] if stats.get("emulated_s") else 0.0
    return {"median_s": statistics.median(times), "late": late}


def measure(speed: float | None, neighbours: str, iterations: int) -> dict:
    """Rank 0 measures; `neighbours`: 'none', 'chips' (3 more of the same) or 'busy' (3 core burners)."""
    world = 1 if neighbours == "none" else 4
    with tempfile.TemporaryDirectory(prefix="h2-trust-") as directory:
        stop_file = os.path.join(directory, "stop")

        def neighbour_speed(rank: int) -> float | None:
            return speed if rank == 0 or neighbours == "chips" else None

        args = [(neighbour_speed(rank), iterations, stop_file, directory, rank == 0 or neighbours == "chips")
                for rank in range(world)]
        results = run_ranks(_per_rank, world, (args, ), timeout=900)
    return results[0]


def _per_rank(rank: int, world_size: int, args: list) -> dict | None:
    return _chip_rank(rank, world_size, *args[rank])


def load() -> str:
    with open("/proc/loadavg") as handle:
        return "load average " + " ".join(handle.read().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=0.1, help="the emulated chip's relative speed")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    print(
        f"one decoder layer of `small`, forward + backward of 1 x 128 tokens, median of {args.iterations} "
        f"iterations; {os.cpu_count()} host cores; before: {load()}", flush=True)
    print(f"{'chip':<24} {'neighbours':<32} {'median ms':>10} {'vs alone':>9} {'late kernel time':>17}")
    rows = [(args.speed, f"emulated at {args.speed:g}"), (None, "host CPU (not emulated)")]
    for speed, label in rows:
        alone = None
        for neighbours, text in (("none", "none"), ("chips", "3 ranks of the same chip"),
                                 ("busy", "3 processes keeping a core busy")):
            result = measure(speed, neighbours, args.iterations)
            alone = alone or result["median_s"]
            print(
                f"{label:<24} {text:<32} {result['median_s'] * 1e3:>10.1f} {result['median_s'] / alone:>9.2f} "
                f"{result['late']:>17.2%}", flush=True)
    half = measure(args.speed / 2, "none", args.iterations)
    full = measure(args.speed, "none", args.iterations)
    print(f"emulated at {args.speed / 2:g} alone: {half['median_s'] * 1e3:.1f} ms, "
          f"{half['median_s'] / full['median_s']:.2f}x "
          f"the chip at {args.speed:g} ({full['median_s'] * 1e3:.1f} ms; expected 2.00x)")
    print(f"after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
