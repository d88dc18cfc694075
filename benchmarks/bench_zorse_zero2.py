"""Gradient + optimizer bytes per rank under ZeRO-1 and ZeRO-2, measured on emulated chips.

    .venv/bin/python benchmarks/bench_zorse_zero2.py [--groups 2 4] [--steps 2] [--out runs/zorse-zero2]

For each group size G it trains one stage of G replicas (emulated discrete chips of one type on one
node, `h2 train --strategy S --cluster C`, the `small` model: hidden 256, 8 layers, seq_len 8, one
sequence per replica, so activations are small beside parameters) twice, with
`optimizer_sharding: zero1` and `zero2`, and reads the peak device memory of the stage
(stage_report.json: the largest torch.dipu.max_memory_allocated over its ranks, over both steps; the
second step holds AdamW's state). Gradient + optimizer bytes = that peak minus the parameters' bytes
(replicated under both); the step's activations (the same in both) stay in it. It prints both, their
ratio, the bytes ZeRO's arithmetic expects (ZeRO-1: P gradients + P for the all-reduce's flat copy +
2P/G AdamW state; ZeRO-2: P/G gradient shards + 2P/G state), and the load before and after.
"""

from __future__ import annotations

import argparse
import os

from h2.core.strategy import strategy_from_mapping
from strategy_runs import load, train_strategy, write_yaml

CHIP = "emu-zero"


def cluster(size: int) -> dict:
    """`size` emulated discrete chips of one type on one node (fast link between them)."""
    return {
        "name": "zero2-bench", "model": "small", "chips": [{
            "name": CHIP, "count": size, "memory_gb": 0.5, "chips_per_node": size, "tp_max": 1, "intra_node_gbps": 2,
            "inter_node_gbps": 1, "latency_us": 50, "peak_tflops": 0.01, "achievable_fraction": 1.0,
            "memory_bandwidth_gbps": 1, "emulation": {"relative_speed": round(0.5 / size, 3)}
        }], "nodes": [{"name": "node0", "site": "local", "chips": {CHIP: size}, "bandwidth_gbps": 2}],
        "sites": [{"name": "local", "bandwidth_gbps": 1}]
    }


def strategy(size: int, sharding: str) -> dict:
    return {
        "dp": size, "micro_batches": 1, "micro_batch_size": 1, "seq_len": 8, "model": "small",
        "optimizer_sharding": sharding, "stages": [{"chips": [CHIP] * size, "tp": 1, "layers": 8}]
    }


def peak_bytes(size: int, sharding: str, out: str, steps: int) -> tuple[int, float]:
    """(the stage's peak device bytes, the last loss) of one run."""
    os.makedirs(out, exist_ok=True)
    cluster_path = write_yaml(os.path.join(out, "cluster.yaml"), cluster(size))
    run = train_strategy("bench_zorse_zero2", strategy(size, sharding), out, steps, ["--cluster", cluster_path])
    return run.peak_bytes, run.loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="runs/zorse-zero2")
    args = parser.parse_args()
    parameters = strategy_from_mapping(strategy(2, "zero1"), "bench").model_config().num_parameters() * 4
    print(f"before: {load()}; parameters {parameters / 1e6:.2f} MB fp32 (P), replicated on every rank")
    print(f"{'G':>3}{'ZeRO-1 MB':>11}{'ZeRO-2 MB':>11}{'ratio':>7}{'expected':>10}  (gradient + optimizer = peak - P)"
          f"{'loss 1':>9}{'loss 2':>9}")
    for size in args.groups:
        results = {
            sharding: peak_bytes(size, sharding, os.path.join(args.out, f"g{size}-{sharding}"), args.steps)
            for sharding in ("zero1", "zero2")
        }
        zero1, zero2 = (results[s][0] - parameters for s in ("zero1", "zero2"))
        expected = (3 / size) / (2 + 2 / size)
        print(f"{size:>3}{zero1 / 1e6:>11.2f}{zero2 / 1e6:>11.2f}{zero2 / zero1:>7.3f}{expected:>10.3f}"
              f"{'':>36}{results['zero1'][1]:>9.4f}{results['zero2'][1]:>9.4f}")
    print("(peak: the largest torch.dipu.max_memory_allocated over the stage's ranks, emulated discrete chips)")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
