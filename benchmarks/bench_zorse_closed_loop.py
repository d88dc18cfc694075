"""The Zorse planner's closed loop on the local emulated mixed cluster: profile -> plan -> train -> compare.

    .venv/bin/python benchmarks/bench_zorse_closed_loop.py [--cluster configs/clusters/local-hetero.yaml]
        [--steps 5] [--warmup 1] [--max-groups N] [--ministages K] [--lone-group-ministages] [--offload auto|on|off]
        [--out runs/zorse-closed-loop] [--reuse-profiles]

Through the product's command lines: `heteroauto profile` measures every chip type into OUT/profiles (afresh
unless --reuse-profiles: bench_closed_loop.profile); `heteroauto search --planner zorse --profiles ...
--no-overlap` plans for the HeteroPP runtime as it is (ZeRO-2 traffic and offload copies not overlapped with
compute; as many pipeline groups as the planner picks, at most --max-groups) and writes the strategy; `h2
train --strategy` runs it. Prints the plan's groups, the prediction (latency model and simulator), the median
measured step after --warmup steps, their ratio against the 20% target, the emulated kernel time that ran late
(it depended on the host, not on the emulated chips) and the machine's load before and after.

PASS or FAIL only for a trustworthy measurement: with more than 5 % of a profile's or the run's emulated
kernel time late (h2.core.emulation.measurement_trust) the verdict is INVALID and the exit status 3
(bench_closed_loop's rule, a host already busy before the start included); 1 on a FAIL, 0 on a PASS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from bench_closed_loop import command, load, profile, refuse_a_busy_host, verdicts  # the HeteroAuto loop's runner
from h2.core.emulation import stage_report_trust

TARGET = 0.20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="configs/clusters/local-hetero.yaml")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-groups", type=int,
                        help="at most this many pipeline groups (default: the planner's choice)")
    parser.add_argument("--offload", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--ministages", type=int, help="ministages per group (default: the planner's choice)")
    parser.add_argument("--lone-group-ministages", action="store_true",
                        help="a plan of one group may take several ministages (heteroauto search's flag)")
    parser.add_argument("--out", default="runs/zorse-closed-loop")
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="take the up-to-date profiles in OUT/profiles instead of measuring every chip type")
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be below --steps")
    print(f"before: {load()}", flush=True)
    refuse_a_busy_host()
    profiles, plan, run = (os.path.join(args.out, name) for name in ("profiles", "plan.yaml", "run"))
    trust = profile(args.cluster, profiles, reuse=args.reuse_profiles)
    limits = (["--max-groups", str(args.max_groups)] if args.max_groups else []) + ([
        "--ministages", str(args.ministages)
    ] if args.ministages else []) + (["--lone-group-ministages"] if args.lone_group_ministages else [])
    planned = json.loads(
        command("h2.cli.heteroauto", "search", "--planner", "zorse", "--cluster", args.cluster, "--profiles", profiles,
                "--no-overlap", "--offload", args.offload, *limits, "--out", plan, "--json"))
    groups = "; ".join(f"group {g}: {', '.join(group['chips'])} rows {group['rows']}"
                       for g, group in enumerate(planned["groups"]))
    print(
        f"plan: {len(planned['groups'])} groups ({groups}), {planned['ministages']} ministages per group, "
        f"offload {'on' if planned['offload'] else 'off'}, recompute {'on' if planned['recompute'] else 'off'}; "
        f"predicted {planned['iteration_s']:.3f} s (simulated {planned['simulated_iteration_s']:.3f} s)", flush=True)
    metrics = os.path.join(run, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    command("h2.cli.main", "train", "--strategy", plan, "--cluster", args.cluster, "--steps", str(args.steps), "--out",
            run, "--overwrite", "--log-every", "1", capture=False)
    with open(metrics) as handle:
        steps = [json.loads(line)["step_time_s"] for line in handle if line.strip()]
    measured = statistics.median(steps[args.warmup:])
    ratio = measured / planned["simulated_iteration_s"]
    print(f"steps: {', '.join(f'{s:.2f}' for s in steps)} s")
    print(f"measured median step {measured:.3f} s / predicted {planned['simulated_iteration_s']:.3f} s = {ratio:.3f}")
    with open(os.path.join(run, "stage_report.json")) as handle:
        report = json.load(handle)
    trust["run"] = stage_report_trust(report)
    print(f"late emulated kernel time: {trust['run'].fraction:.1%} of the emulated kernel time, over all steps "
          f"(per stage: {', '.join('%.2f of %.2f s' % (row['overrun_s'], row['emulated_s']) for row in report)})")
    status = verdicts([(abs(ratio - 1) <= TARGET, f"measured step within {TARGET:.0%} of the prediction "
                        f"({ratio:.3f})")], trust)
    print(f"after: {load()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
