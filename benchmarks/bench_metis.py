"""HeteroAuto beside Metis (SamsungLabs/Metis, USENIX ATC'24) on the same cluster, profiles and model:
search time, and each planner's best plan scored four ways.

    .venv/bin/python benchmarks/bench_metis.py [--repeats 3] [--keep DIR]

Inputs (benchmarks/metis/): cluster.yaml (32 A100 + 32 V100, 8 per node), gpt-6.9b.yaml, and the
profiles H2 synthesises for them; metis/to_metis.py converts all three into Metis's hostfile,
clusterfile and per-(type, tp, batch) profile files. Metis runs unmodified from its public source:
METIS_DIR (a checkout), else a clone of METIS_GIT (default: the fetched mirror
/work/.mirror/SamsungLabs+Metis/repo) into a temporary folder; without either the benchmark says so
and stops. Metis's code is never copied into this repository.

Scores of each best plan (lower is better):
- H2's cost model and H2's event-driven simulator (1F1B action lists, transfers on the links), both
  with the full terms (stage_terms.py);
- an independent transfer-aware estimate written here from Metis-format profiles (no H2 cost code):
  (b - 1) * max_i (c_i + 2 x_i) + sum_i c_i + 2 sum_i x_i + max_i (optimizer_i + ring all-reduce_i),
  x the micro-batch's activation over the smaller side's chips at the slower inter-node link plus
  latency, the all-reduce over NVLink when a stage's replicas share a node;
- Metis's own estimator (model/cost_estimator.py HeteroCostEstimator.get_cost, imported from the
  checkout), in its units (ms; bandwidths given in MiB/ms, see metis/to_metis.py). Metis's plans are
  compared by this estimator, not by the cost Metis prints: the first --metis-plans of its ranked plans
  that an H2 strategy can express are re-estimated and the best taken.
Search time: CPU seconds of Metis's process (from the kernel's child accounting) against the CPU
seconds of H2's search in this process, best of --repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "metis"))

import to_metis  # noqa: E402
from h2.core.schedule import schedule_actions  # noqa: E402
from h2.core.strategy import Strategy  # noqa: E402
from heteroauto.evaluation import evaluate_strategy, training_for  # noqa: E402
from heteroauto.profiles import profiles_for  # noqa: E402
from heteroauto.search import search  # noqa: E402
from heteroauto.simulator import simulate  # noqa: E402

CLUSTER = os.path.join(HERE, "metis", "cluster.yaml")
DEFAULT_GIT = "/work/.mirror/SamsungLabs+Metis/repo"


def metis_checkout(workdir: str) -> str | None:
    if os.environ.get("METIS_DIR"):
        return os.environ["METIS_DIR"] if os.path.exists(os.path.join(os.environ["METIS_DIR"], "cost_het_cluster.py")) \
            else None
    source = os.environ.get("METIS_GIT", DEFAULT_GIT)
    if not (os.path.exists(source) or "://" in source):
        return None
    target = os.path.join(workdir, "metis-src")
    done = subprocess.run(["git", "clone", "--quiet", source, target], capture_output=True, text=True)
    return target if done.returncode == 0 else None


def run_metis(checkout: str, arguments: list[str], log_path: str) -> tuple[list[dict], float, float]:
    """Metis's ranked plans (its log goes to log_path: it prints every plan it tries), its CPU and wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        done = subprocess.run([sys.executable, "cost_het_cluster.py", *arguments], cwd=checkout, stdout=log,
                              stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"Metis failed (exit {done.returncode}); its log: {log_path}")
    ranked, seen = [], False
    with open(log_path) as log:
        for line in log:
            seen = seen or line.startswith("rank, cost")
            if seen:
                ranked += to_metis.metis_plans(line)
    return ranked, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


# ---- an independent transfer-aware estimate -------------------------------------------------------------
def independent_step_s(strategy: Strategy, cluster, model, training, profile_dir: str) -> float:
    """Step time from Metis-format profiles and the cluster's links, written without H2's cost code."""
    stages = strategy.stages
    last = len(stages) - 1
    sequences = strategy.dp * strategy.micro_batch_size
    busy, sends, updates = [], [], []
    first_layer = 0
    for index, stage in enumerate(stages):
        stage_dp = strategy.stage_dp(index)
        batch = sequences // stage_dp
        with open(os.path.join(profile_dir, f"DeviceType.{stage.chip}_tp{stage.tp}_bs{batch}.json")) as handle:
            profile = json.load(handle)
        computes = profile["execution_time"]["layer_compute_total_ms"]
        count = stage.layers + (index == 0) + (index == last)
        compute_ms = sum(computes[first_layer:first_layer + count])
        if index == last:
            compute_ms += profile["execution_time"]["forward_backward_time_ms"] - sum(computes)  # the loss
        first_layer += count
        chip = cluster.chip(stage.chip)
        layer_bytes = profile["model"]["parameters"]["parameters_per_layer_bytes"][first_layer - count:first_layer]
        parameters = sum(layer_bytes) / training.weight_bytes / stage.tp
        link_gbps = chip.intra_node_gbps if stage.tp * stage_dp <= chip.chips_per_node else chip.inter_node_gbps
        ring = 2 * (stage_dp - 1) / stage_dp * parameters * training.weight_bytes / (link_gbps * 1e9)
        adam = parameters * 30 / (chip.memory_bandwidth_gbps * 1e9) / stage_dp
        updates.append(ring + adam)
        busy.append(compute_ms / 1e3)
        if index < last:
            peer = cluster.chip(stages[index + 1].chip)
            lanes = min(stage.tp * stage_dp, stages[index + 1].tp * strategy.stage_dp(index + 1))
            volume = sequences * training.seq_len * model.hidden_size * training.activation_bytes_per_element
            sends.append(volume / lanes / (min(chip.inter_node_gbps, peer.inter_node_gbps) * 1e9) +
                         max(chip.latency_us, peer.latency_us) * 1e-6)
        else:
            sends.append(0.0)
    b = strategy.micro_batches
    return (b - 1) * max(c + 2 * x for c, x in zip(busy, sends)) + sum(busy) + 2 * sum(sends) + max(updates)


# ---- Metis's estimator on any plan ---------------------------------------------------------------------
def metis_estimate(checkout: str, arguments: list[str], strategy: Strategy, order: list[str]) -> float:
    """HeteroCostEstimator.get_cost (Metis's code, unmodified) of an H2 strategy."""
    sys.argv = ["cost_het_cluster.py", *arguments]
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    from arguments import parse_args
    from data_loader import ProfileDataLoader
    from gpu_cluster import GPUCluster
    from model.activation_parameter import GPTActivationAndParam
    from model.cost_estimator import HeteroCostEstimator
    from model.device_group import StagePerformance
    from search_space.plan import InterStagePlan
    from utils import DeviceType, ModelConfig
    args = parse_args()
    cluster = GPUCluster(hostfile_path=args.hostfile_path, clusterfile_path=args.clusterfile_path)
    profile_data, _ = ProfileDataLoader(args.profile_data_path).load_profile_data_all()
    config = ModelConfig(model_name=args.model_name, num_layers=args.num_layers, sequence_length=args.sequence_length,
                         vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                         attention_head_size=args.attention_head_size)
    estimator = HeteroCostEstimator(profile_data, config,
                                    GPTActivationAndParam(config, profile_data["model"]["parameters"]), cluster)
    groups = [stage.tp * strategy.stage_dp(i) for i, stage in enumerate(strategy.stages)]
    partition, total = [0], 0
    for index, stage in enumerate(strategy.stages):
        total += stage.layers + (index == 0) + (index == len(strategy.stages) - 1)
        partition.append(total)
    plan = InterStagePlan(ns_idx=0, node_sequence=[DeviceType.from_string(name) for name in order], dg_idx=0,
                          device_groups=groups, num_stage=len(groups), batches=strategy.micro_batches, gbs=args.gbs)
    placement = StagePerformance(config, profile_data, cluster, plan).get_device_placement()
    strategies = [(strategy.stage_dp(i), stage.tp) for i, stage in enumerate(strategy.stages)]
    sink = open(os.devnull, "w")
    stdout, sys.stdout = sys.stdout, sink
    try:
        return estimator.get_cost(plan, strategies, partition, placement)
    finally:
        sys.stdout = stdout
        sink.close()


def scores(strategy: Strategy, cluster, model, training, profile_dir: str) -> dict:
    training = training_for(strategy, training)
    profiles = profiles_for(cluster, model, training)
    report = evaluate_strategy(strategy, cluster, model, training, profiles)
    replay = simulate(schedule_actions(strategy.schedule, len(strategy.stages), strategy.micro_batches), report.terms)
    return {
        "cost model": report.iteration_s, "simulator": replay.iteration_s, "independent": independent_step_s(
            strategy, cluster, model, training, profile_dir), "fits": report.fits
    }


def describe(strategy: Strategy) -> str:
    return (f"dp={strategy.dp} b={strategy.micro_batches} mbs={strategy.micro_batch_size} stages=" +
            " ".join(f"{s.chip}:tp{s.tp}x{strategy.stage_dp(i)}:{s.layers}" for i, s in enumerate(strategy.stages)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", help="keep Metis's inputs and output in this folder")
    parser.add_argument("--metis-plans", type=int, default=50,
                        help="how many of Metis's ranked plans to re-estimate with its own estimator (default 50)")
    args = parser.parse_args()
    workdir = args.keep or tempfile.mkdtemp(prefix="h2-metis-")
    try:
        checkout = metis_checkout(workdir)
        if checkout is None:
            print("bench_metis: skipped: Metis's source not found (set METIS_DIR to a checkout of "
                  "github.com/SamsungLabs/Metis, or METIS_GIT to a repository to clone)")
            return
        cluster, model, training = to_metis.problem(CLUSTER)
        inputs = os.path.join(workdir, "inputs")
        arguments = to_metis.write_inputs(CLUSTER, inputs)
        profile_dir = os.path.join(inputs, "profile")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; cluster {cluster.name}: " +
              ", ".join(f"{c.count} {c.name}" for c in cluster.chips) + f"; model {model.name} "
              f"({model.num_layers} layers), {training.sequences} x {training.seq_len} tokens per step")
        ranked, metis_cpu, metis_wall = run_metis(checkout, arguments, os.path.join(workdir, "metis_output.txt"))
        expressible = [(p, s) for p in ranked[:args.metis_plans]
                       if (s := to_metis.plan_strategy(p, cluster, model, training))]
        if not expressible:
            raise SystemExit("Metis returned no plan an H2 strategy can express")
        # Metis's printed cost of a plan can leave terms out (its rank-1 line once covered only the first
        # stage), so every compared plan is re-estimated by Metis's own estimator and the best one taken.
        estimated = [(metis_estimate(checkout, arguments, s, p["types"]), p, s) for p, s in expressible]
        printed_first = expressible[0][0]
        print(f"Metis's rank-{printed_first['rank']} plan: printed cost {printed_first['cost']:.1f} ms, "
              f"re-estimated by Metis's estimator {estimated[0][0]:.1f} ms; {len(estimated)} expressible plans of "
              f"its first {args.metis_plans} re-estimated")
        best_estimate, best_plan, best_strategy = min(estimated, key=lambda row: row[0])
        metis_best = (best_plan, best_strategy)
        profiles = profiles_for(cluster, model, training)
        ours_cpu, result = float("inf"), None
        for _ in range(args.repeats):
            started = time.process_time()
            result = search(cluster, model, training, profiles)
            ours_cpu = min(ours_cpu, time.process_time() - started)
        ours = result.best.to_strategy(model, training)
        plan, theirs = metis_best
        print(f"search CPU s: Metis {metis_cpu:.2f} (wall {metis_wall:.2f}, {len(ranked)} plans ranked), "
              f"H2 {ours_cpu:.4f} (best of {args.repeats}); Metis / H2 = {metis_cpu / ours_cpu:,.0f}x")
        print(f"Metis's plan (its rank {plan['rank']}, best re-estimated {best_estimate:.1f} ms): {describe(theirs)}")
        print(f"H2's plan:                {describe(ours)}")
        rows = {
            "Metis": scores(theirs, cluster, model, training, profile_dir), "H2": scores(
                ours, cluster, model, training, profile_dir)
        }
        rows["Metis"]["Metis estimator"] = best_estimate
        rows["H2"]["Metis estimator"] = metis_estimate(checkout, arguments, ours, list(result.best.order))
        print(f"{'plan':<6} {'H2 cost model s':>16} {'H2 simulator s':>15} {'independent s':>14} "
              f"{'Metis estimator ms':>19} {'fits (H2 memory)':>17}")
        for name, row in rows.items():
            print(f"{name:<6} {row['cost model']:>16.4f} {row['simulator']:>15.4f} {row['independent']:>14.4f} "
                  f"{row['Metis estimator']:>19.1f} {str(row['fits']):>17}")
        print("Metis / H2 (above 1: H2's plan is faster): " +
              ", ".join(f"{key} {rows['Metis'][key] / rows['H2'][key]:.3f}"
                        for key in ("cost model", "simulator", "independent", "Metis estimator")))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
