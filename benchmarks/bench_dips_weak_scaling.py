"""Di-PS weak scaling, simulated (h2.ps.simulator, arithmetic on the scenario's numbers, no model runs):
clusters added in descending speed, 1..N of them, each set's token rate through the parameter server
as a percent of the ideal (the same clusters training independently, no PS). The paper reports
98.2-98.6 % of ideal.

    python benchmarks/bench_dips_weak_scaling.py                                 # configs/dips/paper-table1.yaml, 1..7
    python benchmarks/bench_dips_weak_scaling.py --update-from runs/dips/local-4 # the shards' update rate measured
                                                                                 # in that run instead of update_gbps
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    from h2.ps.simulator import load_scenario, measured_update, weak_scaling, with_update_rate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", default=os.path.join(ROOT, "configs", "dips", "paper-table1.yaml"))
    parser.add_argument("--up-to", type=int, default=7, help="largest number of clusters (default 7)")
    parser.add_argument("--rounds-per-cluster", type=int, default=20)
    parser.add_argument("--update-from", metavar="RUN_DIR", help="a run's folder: its measured update rate")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args()
    scenario = load_scenario(args.clusters)
    source = f"update_gbps {scenario.update_gbps:g} from {args.clusters}"
    if args.update_from:
        measured = measured_update(args.update_from)
        scenario = with_update_rate(scenario, measured.gbps_per_shard)
        source = (f"update rate measured in {measured.source}: median {measured.median_update_s:.4f} s for "
                  f"{measured.model_bytes:,} bytes on {measured.shards} shards = {measured.gbps_per_shard:.3f} "
                  f"Gbit/s per shard")
    points = weak_scaling(scenario, args.up_to, args.rounds_per_cluster)
    print(f"simulated (not measured); {source}")
    print(f"{'clusters':>8}  {'added':<6}{'PS site':<9}{'ideal tokens/s':>15}{'through PS':>12}{'% of ideal':>11}")
    for point in points:
        print(f"{len(point.clusters):>8}  {point.clusters[-1]:<6}{point.clusters[point.site]:<9}"
              f"{point.ideal_tokens_per_s:>15,.0f}{point.tokens_per_s:>12,.0f}{point.percent_of_ideal:>10.1f}%")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([point.__dict__ | {"percent_of_ideal": point.percent_of_ideal} for point in points], handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
