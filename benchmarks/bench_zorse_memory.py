"""Peak device memory of Zorse's group as ministages and offload are added, measured on an emulated
mixed-type cluster through the product's own command line.

    .venv/bin/python benchmarks/bench_zorse_memory.py [--cluster configs/clusters/local-zorse.yaml]
        [--strategy configs/strategies/local-zorse-group.yaml] [--steps 3] [--out runs/zorse-memory]

From the one strategy (a group of two emulated chip types, rows 1:3, ZeRO-2) it trains, with
`h2 train --strategy S --cluster C`, five variants: GPipe with 1 ministage and no offload (the
baseline, the seed's PP + ZeRO-2), H2's 1F1B on the same single stage (one micro-batch's activations
alive at a time), GPipe with 2 and 4 ministages and parameter offload, then 4 ministages with
parameters and activations offloaded; for each it prints the largest peak of device memory over the group's ranks
(stage_report.json: torch.dipu.max_memory_allocated on the emulated discrete chips) and the median
step time after the first step, each as a ratio to the baseline's, and the machine's load before
and after (uptime). The seed (Zorse, Figure 10) reports about 40% less memory for about 20% less
throughput at its largest interleaving, on 16 real A100s or A10Gs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = (("gpipe, 1 ministage (baseline: PP + ZeRO-2)", "gpipe", 1, []),
            ("1f1b, 1 ministage (H2's schedule)", "1f1b", 1,
             []), ("gpipe, 2 ministages, parameters offloaded",
                   "gpipe", 2, ["parameters"]), ("gpipe, 4 ministages, parameters offloaded", "gpipe", 4, [
                       "parameters"
                   ]), ("gpipe, 4 ministages, parameters + activations", "gpipe", 4, ["parameters", "activations"]))


def load() -> str:
    with open("/proc/loadavg") as handle:
        return "load average " + " ".join(handle.read().split()[:3])


def train(cluster: str, strategy: dict, out: str, steps: int) -> dict:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "strategy.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(strategy, handle, sort_keys=False)
    run = subprocess.run([
        sys.executable, "-m", "h2.cli.main", "train", "--strategy", path, "--cluster", cluster, "--steps",
        str(steps), "--out", out, "--overwrite", "--log-every",
        str(steps)
    ], cwd=REPO_ROOT, text=True, capture_output=True)
    if run.returncode != 0:
        sys.exit(f"bench_zorse_memory: h2 train failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    with open(os.path.join(out, "stage_report.json")) as handle:
        report = json.load(handle)
    return {
        "peak_bytes": max(row["peak_allocated_bytes"] for row in report),
        "step_s": statistics.median(r["step_time_s"] for r in records[1:] or records), "loss": records[-1]["loss"]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="configs/clusters/local-zorse.yaml")
    parser.add_argument("--strategy", default="configs/strategies/local-zorse-group.yaml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="runs/zorse-memory")
    args = parser.parse_args()
    with open(os.path.join(REPO_ROOT, args.strategy)) as handle:
        base = yaml.safe_load(handle)
    print(f"before: {load()}")
    rows = []
    for index, (name, schedule, ministages, offload) in enumerate(VARIANTS):
        strategy = {**base, "schedule": schedule, "ministages": ministages, "offload": offload}
        rows.append((name, train(args.cluster, strategy, os.path.join(args.out, f"variant-{index}"), args.steps)))
    baseline = rows[0][1]
    print(f"{'variant':<48}{'peak MB':>9}{'x base':>8}{'step s':>9}{'x base':>8}{'loss':>9}")
    for name, result in rows:
        print(f"{name:<48}{result['peak_bytes'] / 1e6:>9.2f}{result['peak_bytes'] / baseline['peak_bytes']:>8.2f}"
              f"{result['step_s']:>9.3f}{result['step_s'] / baseline['step_s']:>8.2f}{result['loss']:>9.4f}")
    print("(emulated chips: peak = largest torch.dipu.max_memory_allocated over the group's ranks)")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
