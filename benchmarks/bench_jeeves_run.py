"""JEEVES against 1F1B on a real pipeline across two emulated sites: measured and predicted.

    .venv/bin/python benchmarks/bench_jeeves_run.py [--cluster configs/clusters/local-2site.yaml]
        [--strategy configs/strategies/local-2site-pp2.yaml] [--steps 20] [--profiles DIR | --synthesised]
        [--json FILE]

Runs `h2 train --strategy S --cluster C --schedule X` for X = 1f1b and jeeves, alternating in this run
(1f1b jeeves jeeves 1f1b for two rounds, so a drift of the shared host's load falls on both), on the
same data (same seed, same batches), and the single-device reference trainer on the same global
batches. Prints per schedule: the largest relative loss difference to the reference over all steps
of all rounds, the measured step time (median over every round's steps after the first; each round's
median beside it), the simulator's prediction
(heteroauto's cost model with the stages' site links, replaying the schedule the ranks ran), and the
ratios jeeves / 1f1b of both, and per schedule measured / predicted with a verdict: within 20 % (PASS or
FAIL), or INVALID when the host's load average exceeded its cores before the benchmark started (other
work: the emulated chips cannot get their share; the benchmark's own ranks claim no more than the
cores, which the launcher checks) or a run's late emulated kernel time broke the trust rule
(h2.core.emulation.UNTRUSTED_FRACTION, from its stage report).

The prediction prices the stages with profiles measured on the emulated chips (`heteroauto profile
--cluster C`, into `--profiles DIR`, reused when already there; the benchmark's own folder otherwise),
as the closed loop does: the synthesised profiles price a kernel by its FLOPs, while an emulated chip
this small spends its time on each kernel's host work at 1/relative_speed (the optimizer step too), so
they predicted the dp2 run ~1.5x too fast. `--synthesised` prices with them anyway (for comparison). A
profile step refusing its measurement ends the benchmark with INVALID, exit 3.

`--strategy configs/strategies/local-2site-dp2.yaml --cluster configs/clusters/local-2site-dp2.yaml`
runs two replicas sharing the cross-site link. Every chip and link here is emulated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_closed_loop import profile  # the HeteroAuto closed loop's profile step (INVALID, exit 3, when refused)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULES = ("1f1b", "jeeves")


def train(strategy: str, cluster: str, schedule: str, steps: int, out: str) -> tuple[list[dict], float]:
    """The run's metrics records and the late fraction of its emulated kernel time (its stage report)."""
    from h2.core.emulation import stage_report_trust

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
        records = [json.loads(line) for line in handle if line.strip()]
    with open(os.path.join(out, "stage_report.json")) as handle:
        return records, stage_report_trust(json.load(handle)).fraction


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


def predicted(strategy_path: str, cluster_path: str, profile_folder: str | None) -> dict[str, float]:
    """The simulator's step time for each schedule, on the orders the ranks run (every replica's, the
    cross-site link one queue that the replicas share: heteroauto.jeeves_plan.predicted_iteration_s),
    priced with the profiles in `profile_folder` (synthesised from the chip types where None)."""
    import dataclasses

    from h2.core.cluster import load_cluster
    from h2.core.strategy import load_strategy
    from heteroauto.jeeves_plan import predicted_iteration_s, strategy_costs, training_of, with_schedule_orders
    from heteroauto.problem import profile_paths
    from heteroauto.profiles import profiles_for

    strategy, cluster = load_strategy(strategy_path), load_cluster(cluster_path)
    profiles = None
    if profile_folder is not None:
        profiles = profiles_for(cluster, strategy.model_config(), training_of(strategy, cluster),
                                profile_paths(cluster, [], profile_folder))
    costs = strategy_costs(strategy, cluster, strategy_path, profiles=profiles)
    times = {}
    for schedule in SCHEDULES:
        scheduled, _ = with_schedule_orders(dataclasses.replace(strategy), cluster, schedule, strategy_path)
        times[schedule] = predicted_iteration_s(scheduled, costs, schedule, strategy_path)
    return times


def verdict(measured_s: float, predicted_s: float, load: float, cores: int, late: float) -> str:
    """PASS when measured is within 20 % of predicted, FAIL otherwise; INVALID when other work already
    filled the host's cores before the run (`load`: the load average before the benchmark's own ranks
    started; theirs is the emulation's claim, checked at launch) or the runs' late kernel time broke the
    trust rule, whatever the numbers."""
    from h2.core.emulation import UNTRUSTED_FRACTION

    if load > cores:
        return f"INVALID (the host was busy before the run: load average {load:.2f} above its {cores} cores)"
    if late > UNTRUSTED_FRACTION:
        return f"INVALID ({late:.1%} of the emulated kernel time ran late)"
    return "PASS" if abs(measured_s / predicted_s - 1) <= 0.2 else "FAIL"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="configs/clusters/local-2site.yaml")
    parser.add_argument("--strategy", default="configs/strategies/local-2site-pp2.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each schedule, alternating (1f1b jeeves jeeves 1f1b)")
    parser.add_argument("--json", help="also write the results to this file")
    pricing = parser.add_mutually_exclusive_group()
    pricing.add_argument(
        "--profiles", metavar="DIR", help="measured profiles of the cluster's chips: measured into "
        "DIR when not there yet (default: the benchmark's own temporary folder)")
    pricing.add_argument("--synthesised", action="store_true",
                         help="price with profiles synthesised from the chip types instead of measured ones")
    args = parser.parse_args()
    load_before = os.getloadavg()
    out_root = tempfile.mkdtemp(prefix="bench-jeeves-")
    profile_folder = None if args.synthesised else (args.profiles or os.path.join(out_root, "profiles"))
    if profile_folder is not None:
        profile(args.cluster, profile_folder, reuse=True)
    order = [SCHEDULES[(index + index // 2) % 2] for index in range(2 * args.rounds)]  # 1f1b jeeves jeeves 1f1b ...
    runs: dict[str, list[list[dict]]] = {schedule: [] for schedule in SCHEDULES}
    late = {schedule: 0.0 for schedule in SCHEDULES}  # the worst round's late fraction
    for index, schedule in enumerate(order):
        records, fraction = train(args.strategy, args.cluster, schedule, args.steps,
                                  os.path.join(out_root, f"{index}-{schedule}"))
        runs[schedule].append(records)
        late[schedule] = max(late[schedule], fraction)
    ref = reference(args.strategy, args.steps)
    prediction = predicted(args.strategy, args.cluster, profile_folder)
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
            "round_medians_s": [statistics.median(r["step_time_s"] for r in records[1:]) for records in rounds
                                ], "predicted_step_s": prediction[schedule], "late_fraction": late[schedule]
        }
    print(f"two emulated sites ({args.cluster}), {args.strategy}, {args.steps} steps x {args.rounds} rounds "
          f"({' '.join(order)}); load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; priced with "
          f"{'synthesised profiles' if profile_folder is None else 'the profiles measured in ' + profile_folder}")
    print(f"{'schedule':>8} {'loss diff':>10} {'measured s':>11} {'per round s':>14} {'predicted s':>12} "
          f"{'measured/predicted':>19} {'late':>6}  within 20 %")
    load, cores = load_before[0], os.cpu_count() or 1
    for schedule, row in results.items():
        per_round = " ".join(f"{value:.3f}" for value in row["round_medians_s"])
        row["measured_over_predicted"] = row["measured_step_s"] / row["predicted_step_s"]
        row["verdict"] = verdict(row["measured_step_s"], row["predicted_step_s"], load, cores, row["late_fraction"])
        print(f"{schedule:>8} {row['max_relative_loss_difference']:>10.2e} {row['measured_step_s']:>11.4f} "
              f"{per_round:>14} {row['predicted_step_s']:>12.4f} {row['measured_over_predicted']:>19.3f} "
              f"{row['late_fraction']:>6.1%}  "
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
