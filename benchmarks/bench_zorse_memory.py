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
import os

import yaml

from strategy_runs import REPO_ROOT, load, train_strategy

VARIANTS = (("gpipe, 1 ministage (baseline: PP + ZeRO-2)", "gpipe", 1, []),
            ("1f1b, 1 ministage (H2's schedule)", "1f1b", 1,
             []), ("gpipe, 2 ministages, parameters offloaded",
                   "gpipe", 2, ["parameters"]), ("gpipe, 4 ministages, parameters offloaded", "gpipe", 4, [
                       "parameters"
                   ]), ("gpipe, 4 ministages, parameters + activations", "gpipe", 4, ["parameters", "activations"]))


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
        rows.append((name,
                     train_strategy("bench_zorse_memory", strategy, os.path.join(args.out, f"variant-{index}"),
                                    args.steps, ["--cluster", args.cluster])))
    baseline = rows[0][1]
    print(f"{'variant':<48}{'peak MB':>9}{'x base':>8}{'step s':>9}{'x base':>8}{'loss':>9}")
    for name, result in rows:
        print(f"{name:<48}{result.peak_bytes / 1e6:>9.2f}{result.peak_bytes / baseline.peak_bytes:>8.2f}"
              f"{result.step_s:>9.3f}{result.step_s / baseline.step_s:>8.2f}{result.loss:>9.4f}")
    print("(emulated chips: peak = largest torch.dipu.max_memory_allocated over the group's ranks)")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
