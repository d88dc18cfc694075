"""Step time of Zorse's micro-batch reshuffling between uneven groups, against static maps, on emulated
chips of uneven speed.

    .venv/bin/python benchmarks/bench_zorse_reshuffle.py [--steps 6] [--micro-batches 8]
        [--slow-speed 0.05] [--out runs/zorse-reshuffle]

A cluster file written here: one emu-slow chip (--slow-speed of a host core) and two emu-fast chips
(3x that each) on one node (7x --slow-speed of a core in all: 0.35 by default, within the trust
rule's 0.5 x 2 cores). The strategy: the `small`
model (8 layers, hidden 256) at seq_len 32, micro-batches of 4 sequences, GPipe order; stage 0 a
group of emu-slow and emu-fast with rows 1:3 (5 layers), stage 1 one emu-fast (3 layers and the
head): a boundary from dp 2 to dp 1. Trained with `h2 train --strategy S --cluster C` three ways:

  rows split (static)        reshuffle off: every replica takes its rows of every micro-batch, and
                             each micro-batch moves from both senders to the receiver (today's map)
  whole, static map          reshuffle: true --no-reshuffle-by-finish: whole micro-batches, micro-batch
                             i to where the i-th finished would go, received in micro-batch order
  whole, reshuffled          reshuffle: true: the i-th finished micro-batch to the replica with the
                             i-th most work left, received in finish order (Zorse's 4.2)

It prints each one's median step time after the first step, its ratio to the rows split, the last
loss, the stage report's late emulated kernel time, and the load before and after. A run whose late
kernel time exceeds h2.core.emulation.UNTRUSTED_FRACTION of its emulated kernel time depends on the
host's load, not the emulated chips: the verdict is INVALID and the exit status 3.
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
sys.path.insert(0, REPO_ROOT)

from h2.core.emulation import stage_report_trust  # noqa: E402

VARIANTS = (("rows split (static)", False, []), ("whole, static map", True, ["--no-reshuffle-by-finish"]),
            ("whole, reshuffled", True, []))
CHIP = {
    "memory_gb": 0.5, "chips_per_node": 3, "tp_max": 1, "intra_node_gbps": 2, "inter_node_gbps": 1, "latency_us": 50,
    "achievable_fraction": 1.0, "memory_bandwidth_gbps": 1
}


def load() -> str:
    with open("/proc/loadavg") as handle:
        return "load average " + " ".join(handle.read().split()[:3])


def cluster(slow_speed: float) -> dict:
    chips = [{"name": "emu-slow", "count": 1, "peak_tflops": 0.005, "emulation": {"relative_speed": slow_speed}},
             {"name": "emu-fast", "count": 2, "peak_tflops": 0.015, "emulation": {"relative_speed": 3 * slow_speed}}]
    for chip in chips:
        chip.update(CHIP)
    return {
        "name": "reshuffle-bench", "model": "small", "chips": chips, "nodes": [{
            "name": "node0", "site": "local", "chips": {"emu-slow": 1, "emu-fast": 2}, "bandwidth_gbps": 2
        }], "sites": [{"name": "local", "bandwidth_gbps": 1}]
    }


def strategy(reshuffle: bool, micro_batches: int) -> dict:
    return {
        "dp": 2, "micro_batches": micro_batches, "micro_batch_size": 2, "seq_len": 32, "model": "small",
        "schedule": "gpipe", "reshuffle": reshuffle, "stages": [{
            "chips": ["emu-slow", "emu-fast"], "rows": [1, 3], "tp": 1, "layers": 5
        }, {"chip": "emu-fast", "dp": 1, "tp": 1, "layers": 3}]
    }


def write_yaml(path: str, data: dict) -> str:
    with open(path, "w") as handle:
        yaml.safe_dump(data, handle, sort_keys=False)
    return path


def train(out: str, cluster_path: str, reshuffle: bool, flags: list[str], steps: int, micro_batches: int) -> dict:
    os.makedirs(out, exist_ok=True)
    run = subprocess.run([
        sys.executable, "-m", "h2.cli.main", "train", "--strategy",
        write_yaml(os.path.join(out, "strategy.yaml"), strategy(reshuffle, micro_batches)), "--cluster", cluster_path,
        "--steps",
        str(steps), "--out", out, "--overwrite", "--log-every",
        str(steps), *flags
    ], cwd=REPO_ROOT, text=True, capture_output=True)
    if run.returncode != 0:
        sys.exit(f"bench_zorse_reshuffle: h2 train failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    with open(os.path.join(out, "stage_report.json")) as handle:
        report = json.load(handle)
    return {
        "step_s": statistics.median(r["step_time_s"] for r in records[1:] or records), "loss": records[-1]["loss"],
        "trust": stage_report_trust(report), "steps": [round(r["step_time_s"], 3) for r in records]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--slow-speed", type=float, default=0.05)
    parser.add_argument("--out", default="runs/zorse-reshuffle")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cluster_path = write_yaml(os.path.join(os.path.abspath(args.out), "cluster.yaml"), cluster(args.slow_speed))
    print(f"before: {load()}")
    rows = [(name,
             train(os.path.join(args.out, f"variant-{i}"), cluster_path, reshuffle, flags, args.steps,
                   args.micro_batches)) for i, (name, reshuffle, flags) in enumerate(VARIANTS)]
    print(f"after: {load()}")
    baseline = rows[0][1]
    print(f"{'variant':<24}{'step s':>8}{'x rows':>8}{'loss':>9}{'late':>8}  steps")
    for name, result in rows:
        print(f"{name:<24}{result['step_s']:>8.3f}{result['step_s'] / baseline['step_s']:>8.2f}"
              f"{result['loss']:>9.4f}{result['trust'].fraction:>8.1%}  {result['steps']}")
    late = [name for name, result in rows if not result["trust"].trusted]
    if late:
        print(f"INVALID: late emulated kernel time above the trust rule in: {', '.join(late)}")
        sys.exit(3)
    print(f"reshuffled / static map: {rows[2][1]['step_s'] / rows[1][1]['step_s']:.2f}; "
          f"reshuffled / rows split: {rows[2][1]['step_s'] / baseline['step_s']:.2f}")


if __name__ == "__main__":
    main()
