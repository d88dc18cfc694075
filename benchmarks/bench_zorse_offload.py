"""Step time of a ministage group with parameter offload, synchronous and prefetched, against no offload.

    .venv/bin/python benchmarks/bench_zorse_offload.py [--steps 5] [--host-link-gbps 0.1]
        [--relative-speed 0.25] [--grad-clip-scope ministage|global] [--out runs/zorse-offload]

One rank on an emulated discrete chip (the dipu host vendor with a profile written here: not
host-accessible, host link of --host-link-gbps, kernels held to 1/--relative-speed of the host's
time), the `small` model (hidden 256, 8 layers) in 4 ministages of 2 layers, GPipe order, 4
micro-batches of 2 sequences of 32 tokens, trained with `h2 train --strategy S --device dipu` three
ways: no offload; parameters offloaded and copied when a ministage needs them
(`--no-offload-prefetch`); parameters offloaded with the next ministage's copied in on a side thread
while the current one computes (the default: two ministages resident). It prints each one's median
step time after the first step and its ratio to no offload, the peak device memory, the last loss,
and the load before and after, and the late emulated kernel time (the stage report's overrun over emulated kernel
time: above h2.core.emulation.UNTRUSTED_FRACTION the host's load, not the chip, set the time).
`--grad-clip-scope ministage` (the default here, Zorse's) clips
and steps each ministage right after its backward, while it is resident; `global` clips by the norm
over all ministages, so every ministage comes back to the device once more for its step after the
backward.
"""

from __future__ import annotations

import argparse
import os

from strategy_runs import load, train_strategy, write_yaml

VARIANTS = (("no offload", [], []), ("parameters offloaded, synchronous copies", ["parameters"], [
    "--no-offload-prefetch"
]), ("parameters offloaded, next ministage prefetched", ["parameters"], []))


def profile(host_link_gbps: float, relative_speed: float) -> dict:
    return {
        "name": "offload-bench", "description": "a slow discrete chip on a slow host link", "device_count": 1,
        "memory_capacity": "4GiB", "relative_speed": relative_speed, "host_accessible": False,
        "host_link_gbps": host_link_gbps, "host_link_latency_us": 5
    }


def strategy(offload: list[str]) -> dict:
    return {
        "dp": 1, "micro_batches": 4, "micro_batch_size": 2, "seq_len": 32, "model": "small", "schedule": "gpipe",
        "ministages": 4, "offload": offload, "stages": [{"chip": "emu", "tp": 1, "layers": 8}]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--host-link-gbps", type=float, default=0.1)
    parser.add_argument("--relative-speed", type=float, default=0.25)
    parser.add_argument("--grad-clip-scope", choices=("ministage", "global"), default="ministage")
    parser.add_argument("--out", default="runs/zorse-offload")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    profile_path = write_yaml(os.path.join(os.path.abspath(args.out), "profile.yaml"),
                              profile(args.host_link_gbps, args.relative_speed))
    print(f"before: {load()}")
    rows = [(name,
             train_strategy("bench_zorse_offload", strategy(offload), os.path.join(args.out, f"variant-{i}"),
                            args.steps, ["--device", "dipu", "--grad-clip-scope", args.grad_clip_scope, *flags],
                            {"DIPU_HOST_PROFILE": profile_path})) for i, (name, offload, flags) in enumerate(VARIANTS)]
    baseline = rows[0][1]
    print(f"{'variant':<50}{'step s':>8}{'x none':>8}{'peak MB':>9}{'loss':>9}{'late':>7}  steps")
    for name, result in rows:
        print(f"{name:<50}{result.step_s:>8.3f}{result.step_s / baseline.step_s:>8.2f}"
              f"{result.peak_bytes / 1e6:>9.2f}{result.loss:>9.4f}{result.late:>7.1%}  {result.step_times}")
    print(f"(step: median after the first; host link {args.host_link_gbps} GB/s, relative speed "
          f"{args.relative_speed}, grad clip scope {args.grad_clip_scope})")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
