"""The Zorse planner's closed loop on the local emulated mixed cluster: profile -> plan -> train -> compare.

    .venv/bin/python benchmarks/bench_zorse_closed_loop.py [--cluster configs/clusters/local-hetero.yaml]
        [--steps 5] [--warmup 1] [--ministages K] [--offload auto|on|off] [--out runs/zorse-closed-loop]

Through the product's command lines: `heteroauto profile` measures every chip type (cached in
OUT/profiles); `heteroauto search --planner zorse --profiles ... --no-overlap --max-groups 1` plans for
the HeteroPP runtime as it is (one mixed-type group; ZeRO-2 traffic and offload copies not overlapped
with compute) and writes the strategy; `h2 train --strategy` runs it. Prints the prediction (latency
model and simulator), the median measured step after --warmup steps, their ratio against the 20%
target, the share of emulated kernel time that ran late (the host, not the emulated chip, set it:
stage_report.json overrun_s / emulated_s over all ranks), the fullest rank's peak device memory, and the
machine's load before and after. --ministages and --offload fix those choices of the search (the
one-group variants of the local-zorse cluster: plain and `--ministages 2 --offload on`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

from bench_closed_loop import command, load, train   # the HeteroAuto closed loop's runner: the same command lines

TARGET = 0.20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="configs/clusters/local-hetero.yaml")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--ministages", type=int, help="fix the ministages of the plan (heteroauto search --ministages)")
    parser.add_argument("--offload", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--out", default="runs/zorse-closed-loop")
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be below --steps")
    print(f"before: {load()}", flush=True)
    profiles, plan, run = (os.path.join(args.out, name) for name in ("profiles", "plan.yaml", "run"))
    command("h2.cli.heteroauto", "profile", "--cluster", args.cluster, "--out-dir", profiles, capture=False)
    planned = json.loads(command("h2.cli.heteroauto", "search", "--planner", "zorse", "--cluster", args.cluster,
                                 "--profiles", profiles, "--no-overlap", "--max-groups", "1", "--out", plan,
                                 "--offload", args.offload,
                                 *(["--ministages", str(args.ministages)] if args.ministages else []), "--json"))
    group = planned["groups"][0]
    print(f"plan: {len(group['chips'])} ranks ({', '.join(group['chips'])}), rows {group['rows']}, "
          f"{planned['ministages']} ministages, offload {'on' if planned['offload'] else 'off'}, recompute "
          f"{'on' if planned['recompute'] else 'off'}; predicted {planned['iteration_s']:.3f} s "
          f"(simulated {planned['simulated_iteration_s']:.3f} s)", flush=True)
    shutil.rmtree(run, ignore_errors=True)   # this bench's own run folder: a re-run trains afresh
    measured = train(args.cluster, plan, run, args.steps, args.warmup)
    steps, step = measured["steps"], measured["step_s"]
    ratio = step / planned["simulated_iteration_s"]
    print(f"steps: {', '.join(f'{s:.2f}' for s in steps)} s")
    print(f"measured median step {step:.3f} s / predicted {planned['simulated_iteration_s']:.3f} s = {ratio:.3f} "
          f"({'PASS' if abs(ratio - 1) <= TARGET else 'FAIL'}: within {TARGET:.0%})")
    ranks = measured["stages"]
    emulated = sum(rank["emulated_s"] for rank in ranks)
    late = sum(rank["overrun_s"] for rank in ranks) / emulated if emulated else 0.0
    peak = max(rank["peak_allocated_bytes"] for rank in ranks) / 1e6
    print(f"late kernel time {late:.2%} of {emulated:.2f} emulated kernel s (all ranks); "
          f"peak device memory of the fullest rank {peak:.2f} MB")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
