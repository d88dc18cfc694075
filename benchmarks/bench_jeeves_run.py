"""JEEVES against 1F1B on a real pipeline across two emulated sites: measured and predicted.

    .venv/bin/python benchmarks/bench_jeeves_run.py [--cluster configs/clusters/local-2site.yaml]
        [--strategy configs/strategies/local-2site-pp2.yaml] [--steps 20] [--json FILE]

Runs `h2 train --strategy S --cluster C --schedule X` for X = 1f1b and jeeves, alternating in this run
(1f1b jeeves jeeves 1f1b for two rounds, so a drift of the shared host's load falls on both), on the
same data (same seed, same batches), and the single-device reference trainer on the same global
batches. Prints per schedule: the largest relative loss difference to the reference over all steps
of all rounds, the measured step time (median over every round's steps after the first; each round's
median beside it), the simulator's prediction
(heteroauto's cost model with the stages' site links, replaying the schedule the ranks ran), and the
ratios jeeves / 1f1b of both, and per schedule measured / predicted with a verdict: within 20 % (PASS or
FAIL), or INVALID when the host's load average exceeded its cores (oversubscribed: the emulated chips
cannot get their share). `--strategy configs/strategies/local-2site-dp2.yaml --cluster
configs/clusters/local-2site-dp2.yaml` runs two replicas sharing the cross-site link. Every chip and
link here is emulated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULES = ("1f1b", "jeeves")


def train(strategy: str, cluster: str, schedule: str, steps: int, out: str) -> list[dict]:
    command = [
        sys.executable, "-m", "h2", "train", "--strategy", strategy, "--cluster", cluster, "--schedule", schedule,
        "--steps",
        str(steps), "--threads", "1", "--out", out, "--overwrite"
    ]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(
            f"bench_jeeves_run: {' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith("h2: ")), flush=True)
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def reference(strategy_path: str, steps: int) -> list[dict]:
    """The single-device trainer (fp32, one thread) on the same global batches."""
    import torch

    from h2.core.strategy import load_strategy
    from h2.train import TrainConfig, Trainer

    strategy = load_strategy(strategy_path)
    model = strategy.model_config()
    config = TrainConfig(steps=steps, micro_batch_size=strategy.micro_batch_size, micro_batches=strategy.micro_batches *
                         strategy.dp, seq_len=strategy.seq_len or model.max_seq_len)
    torch.set_num_threads(1)
    return Trainer(model, config, tempfile.mkdtemp(prefix="bench-jeeves-ref-"), show_progress=False).run()


def predicted(strategy_path: str, cluster_path: str) -> dict[str, float]:
    """The simulator's step time for each schedule, on the orders the ranks run (every replica's, the
    cross-site link one queue that the replicas share: heteroauto.jeeves_plan.predicted_iteration_s)."""
    import dataclasses

    from h2.core.cluster import load_cluster
    from h2.core.strategy import load_strategy
    from heteroauto.jeeves_plan import predicted_iteration_s, strategy_costs, with_schedule_orders

    strategy, cluster = load_strategy(strategy_path), load_cluster(cluster_path)
    costs = strategy_costs(strategy, cluster, strategy_path)
    times = {}
    for schedule in SCHEDULES:
        scheduled, _ = with_schedule_orders(dataclasses.replace(strategy), cluster, schedule, strategy_path)
        times[schedule] = predicted_iteration_s(scheduled, costs, schedule, strategy_path)
    return times


def verdict(measured_s: float, predicted_s: float, load: float, cores: int) -> str:
    """PASS when measured is within 20 % of predicted, FAIL otherwise; INVALID when the host was
    oversubscribed (load average above its cores) whatever the numbers."""
    if load > cores:
        return "INVALID (host oversubscribed)"
    return "PASS" if abs(measured_s / predicted_s - 1) <= 0.2 else "FAIL"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="configs/clusters/local-2site.yaml")
    parser.add_argument("--strategy", default="configs/strategies/local-2site-pp2.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each schedule, alternating (1f1b jeeves jeeves 1f1b)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    load_before = os.getloadavg()
    out_root = tempfile.mkdtemp(prefix="bench-jeeves-")
    order = [SCHEDULES[(index + index // 2) % 2] for index in range(2 * args.rounds)]  # 1f1b jeeves jeeves 1f1b ...
    runs: dict[str, list[list[dict]]] = {schedule: [] for schedule in SCHEDULES}
    for index, schedule in enumerate(order):
        runs[schedule].append(
            train(args.strategy, args.cluster, schedule, args.steps, os.path.join(out_root, f"{index}-{schedule}")))
    ref = reference(args.strategy, args.steps)
    prediction = predicted(args.strategy, args.cluster)
    load_after = os.getloadavg()
    results = {}
    for schedule, rounds in runs.items():
        for records in rounds:
            assert [r["step"] for r in records] == [r["step"] for r in ref], "steps differ from the reference"
        loss_diff = max(abs(r["loss"] - q["loss"]) / abs(q["loss"]) for records in rounds for r, q in zip(records, ref))
        results[schedule] = {
            "max_relative_loss_difference": loss_diff, "measured_step_s": statistics.median(r["step_time_s"]
                                                                                            for records in rounds
                                                                                            for r in records[1:]),
            "round_medians_s": [statistics.median(r["step_time_s"] for r in records[1:])
                                for records in rounds], "predicted_step_s": prediction[schedule]
        }
    print(f"two emulated sites ({args.cluster}), {args.strategy}, {args.steps} steps x {args.rounds} rounds "
          f"({' '.join(order)}); load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"{'schedule':>8} {'loss diff':>10} {'measured s':>11} {'per round s':>14} {'predicted s':>12} "
          f"{'measured/predicted':>19}  within 20 %")
    load, cores = max(load_before[0], load_after[0]), os.cpu_count() or 1
    for schedule, row in results.items():
        per_round = " ".join(f"{value:.3f}" for value in row["round_medians_s"])
        row["measured_over_predicted"] = row["measured_step_s"] / row["predicted_step_s"]
        row["verdict"] = verdict(row["measured_step_s"], row["predicted_step_s"], load, cores)
        print(f"{schedule:>8} {row['max_relative_loss_difference']:>10.2e} {row['measured_step_s']:>11.4f} "
              f"{per_round:>14} {row['predicted_step_s']:>12.4f} {row['measured_over_predicted']:>19.3f}  "
              f"{row['verdict']}")
    measured_ratio = results["jeeves"]["measured_step_s"] / results["1f1b"]["measured_step_s"]
    predicted_ratio = results["jeeves"]["predicted_step_s"] / results["1f1b"]["predicted_step_s"]
    print(f"jeeves / 1f1b: measured {measured_ratio:.3f}, predicted {predicted_ratio:.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "results": results, "measured_ratio": measured_ratio, "predicted_ratio": predicted_ratio,
                    "load_before": load_before, "load_after": load_after
                }, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
