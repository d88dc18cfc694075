"""HeteroAuto's search time over a sweep of cluster sizes: 2-6 chip types, 32-12,288 chips, 32-128 layers,
one search per point (default settings: groups of 128 chips, every dp and stage order, full cost model),
CPU seconds of this single-threaded process, and the fitted growth cpu ~ k^a * chips^b * layers^c.

    .venv/bin/python benchmarks/bench_search_sweep.py [--types 2,3,4,5,6] [--chips 32,96,384,1536,4096,12288]
                                                       [--layers 32,64,96,128] [--time-limit S] [--json FILE]

Chip types: the paper's A-D (configs/chips) and two more inside Table 5's ranges (E: 1.3x A100, 80 GB;
F: 0.6x A100, 48 GB); a cluster of k types takes the first k, its chips split evenly in multiples of the
largest power of two below half a type's share. Model: the H2 paper's 100B layer shape (h2-100b) with
the point's layer count from 384 chips up; a 7B-class shape (hidden 4096) below, where 100B-wide layers
do not fit. Global batch 4M tokens of 4096.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

import numpy as np

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec, load_cluster
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig, preset
from heteroauto.profiles import profiles_for
from heteroauto.search import search

WORST_TARGET_S = 10.0  # issue 35: the worst points (4 types x 1,024 chips, 6 x 1,536, 128 layers) under this
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTRA = {
    "E": dict(memory_gb=80, chips_per_node=8, peak_tflops=406, intra_node_gbps=300), "F": dict(
        memory_gb=48, chips_per_node=8, peak_tflops=187, intra_node_gbps=150)
}


def chip_types() -> list[ChipType]:
    clusters = load_cluster(os.path.join(ROOT, "configs", "clusters", "exp-b-1.yaml"))
    paper = [clusters.chip(name) for name in "ABCD"]
    base = paper[1]
    return paper + [dataclasses.replace(base, name=name, **fields) for name, fields in EXTRA.items()]


def cluster(types: int, chips: int) -> ClusterSpec:
    unit = 1 << max(0, int(math.log2(chips / types / 2)))  # counts in large powers of two: dp can grow
    counts = [chips // types // unit * unit] * types
    for i in range(types):
        if sum(counts) + unit <= chips:
            counts[i] += unit
    counts[0] += chips - sum(counts)
    kinds = chip_types()[:types]
    return ClusterSpec(name=f"sweep-{types}x{chips}", source="sweep", chips=tuple(
        dataclasses.replace(kind, count=count) for kind, count in zip(kinds, counts)))


def model(chips: int, layers: int) -> ModelConfig:
    if chips >= 384:
        return dataclasses.replace(preset("h2-100b"), name=f"h2-100b-{layers}l", num_layers=layers)
    return ModelConfig(name=f"7b-{layers}l", vocab_size=32000, hidden_size=4096, num_layers=layers, num_heads=32,
                       num_kv_heads=8, intermediate_size=11008, max_seq_len=4096)


def run_point(types: int, chips: int, layers: int, time_limit: float | None) -> dict:
    spec, net = cluster(types, chips), model(chips, layers)
    training = TrainingSpec(seq_len=4096, global_batch_tokens=4 * 2**20)
    profiles = profiles_for(spec, net, training)
    started = time.process_time()
    try:
        result = search(spec, net, training, profiles, time_limit_s=time_limit)
        outcome = {
            "iteration_s": result.best.objective_s, "optimal": result.optimal, "gap": result.gap, "dp": result.best.dp,
            "stages": sum(result.best.pps), "order": "".join(result.best.order), "evaluated": result.evaluated
        }
    except UserError as error:  # infeasible (proved), or no plan within the time limit (nothing proved)
        proved = "time limit" not in str(error)
        outcome = {"error": str(error)[:80], "optimal": proved, "gap": 0.0 if proved else math.inf}
    return {
        "types": types, "chips": chips, "layers": layers, "counts": [c.count for c in spec.chips],
        "cpu_s": time.process_time() - started, **outcome
    }


def fit(rows: list[dict]) -> tuple[float, float, float, float]:
    """Least squares of log cpu = a log k + b log chips + c log layers + d."""
    usable = [r for r in rows if r["cpu_s"] > 0]
    x = np.array([[math.log(r["types"]), math.log(r["chips"]), math.log(r["layers"]), 1.0] for r in usable])
    y = np.array([math.log(r["cpu_s"]) for r in usable])
    solution, *_ = np.linalg.lstsq(x, y, rcond=None)
    return tuple(float(v) for v in solution)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="2,3,4,5,6")
    parser.add_argument("--chips", default="32,96,384,1536,4096,12288")
    parser.add_argument("--layers", default="32,64,96,128")
    parser.add_argument("--time-limit", type=float, help="CPU seconds per search (the plan is then within its gap)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores" +
          (f"; time limit {args.time_limit:g} CPU s per search" if args.time_limit else ""))
    print(f"{'types':>5} {'chips':>6} {'layers':>6} {'cpu s':>8} {'proved':>7} {'gap':>7} {'dp':>4} {'stages':>6} "
          f"{'order':>7} {'evals':>6}  iteration s / outcome")
    rows = []
    for types in map(int, args.types.split(",")):
        for chips in map(int, args.chips.split(",")):
            for layers in map(int, args.layers.split(",")):
                row = run_point(types, chips, layers, args.time_limit)
                rows.append(row)
                outcome = f"{row['iteration_s']:.3f}" if "iteration_s" in row else row["error"]
                print(
                    f"{types:>5} {chips:>6} {layers:>6} {row['cpu_s']:>8.2f} {'yes' if row['optimal'] else 'no':>7} "
                    f"{row['gap'] * 100:>6.2f}% {row.get('dp', '-'):>4} {row.get('stages', '-'):>6} "
                    f"{row.get('order', '-'):>7} {row.get('evaluated', '-'):>6}  {outcome}", flush=True)
    worst = max(rows, key=lambda r: r["cpu_s"])
    a, b, c, _ = fit(rows)
    print(f"points {len(rows)}; worst {worst['cpu_s']:.2f} CPU s ({worst['types']} types, {worst['chips']} chips, "
          f"{worst['layers']} layers); median {float(np.median([r['cpu_s'] for r in rows])):.2f} s; "
          f"proved optimal {sum(r['optimal'] for r in rows)}/{len(rows)}; largest gap "
          f"{max(r['gap'] for r in rows) * 100:.2f}%; worst under the {WORST_TARGET_S:g} s target: "
          f"{'yes' if worst['cpu_s'] < WORST_TARGET_S else 'no'}")
    print(f"fitted growth: cpu ~ types^{a:.2f} x chips^{b:.2f} x layers^{c:.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
