"""Zorse's planner against HeteroAuto's on the Zorse paper's clusters A, B, C (configs/clusters/zorse-*.yaml)
with LLaMA 7B/13B/33B/65B shapes, both plans scored by the one simulator (heteroauto.simulator).

For each cluster and model it prints: the Zorse planner's wall time (the acceptance asks under 60 s),
its plan (groups, micro-batch, ministages, offload), its latency-model prediction and its simulated
step; HeteroAuto's best strategy within --heteroauto-limit CPU seconds (its exact search, full cost
model) and its simulated step; and the ratio HeteroAuto / Zorse of the simulated steps (above 1: Zorse
faster). A planner that finds nothing that fits prints the one-line reason.

    .venv/bin/python benchmarks/bench_zorse_planner.py [--clusters a,b,c] [--models 7b,13b,33b,65b] [--min-groups N]
        [--lone-group-ministages] [--memory-fraction F] [--heteroauto-limit S | --no-heteroauto]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.model_config import resolve_model
from h2.core.schedule import schedule_actions
from heteroauto.evaluation import evaluate_strategy
from heteroauto.profiles import profiles_for
from heteroauto.search import search
from heteroauto.simulator import simulate
from heteroauto.zorse.costs import Shapes
from heteroauto.zorse.planner import plan, rates_from_profiles
from heteroauto.zorse.scoring import plan_schedule, plan_terms


def zorse_row(cluster, model, training, profiles, memory_fraction, min_groups=1, lone_group_ministages=False):
    started = time.perf_counter()
    rates = rates_from_profiles(cluster, profiles, memory_fraction)
    try:
        found = plan(cluster, model, training, rates, min_groups=min_groups,
                     lone_group_ministages=lone_group_ministages)
    except UserError as error:
        return time.perf_counter() - started, None, str(error)
    took = time.perf_counter() - started
    best = found.best
    simulated = simulate(plan_schedule(best), plan_terms(best, rates, Shapes.of(model, training))).iteration_s
    groups = " | ".join(f"{len(g.chips)}x[{','.join(sorted(set(g.chips)))}] L{g.layers}" for g in best.groups)
    text = (f"{len(best.groups)} groups ({groups}), S {best.micro_batch_sequences} x M {best.micro_batches}, "
            f"{best.ministages} ministages, offload {'on' if best.offload else 'off'}, "
            f"memory {best.max_memory_fraction:.2f}")
    return took, (best.latency.iteration_s, simulated), text


def heteroauto_row(cluster, model, training, limit_s):
    training = dataclasses.replace(training, micro_batch_size=1)
    profiles = profiles_for(cluster, model, training, [])
    started = time.perf_counter()
    try:
        result = search(cluster, model, training, profiles, time_limit_s=limit_s)
    except UserError as error:
        return time.perf_counter() - started, None, str(error)
    took = time.perf_counter() - started
    strategy = result.best.to_strategy(model, training)
    report = evaluate_strategy(strategy, cluster, model, training, profiles)
    simulated = simulate(schedule_actions(strategy.schedule, len(strategy.stages), strategy.micro_batches),
                         report.terms).iteration_s
    stages = " ".join(f"{s.chip}:tp{s.tp}dp{strategy.stage_dp(i)}L{s.layers}" for i, s in enumerate(strategy.stages))
    return took, simulated, f"dp {strategy.dp}, {len(strategy.stages)} stages [{stages}], b {strategy.micro_batches}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", default="a,b,c")
    parser.add_argument("--models", default="7b,13b,33b,65b")
    parser.add_argument("--memory-fraction", type=float, default=1.0)
    parser.add_argument("--heteroauto-limit", type=float, default=30.0, help="CPU seconds for HeteroAuto's search")
    parser.add_argument("--no-heteroauto", action="store_true")
    parser.add_argument("--min-groups", type=int, default=1,
                        help="Zorse plans of at least this many groups (2: none of one group of all machines)")
    parser.add_argument(
        "--lone-group-ministages", action="store_true",
        help="a Zorse plan of one group may take several ministages (default: one, the authors' planner)")
    args = parser.parse_args()
    print(f"{'cluster':7} {'model':5} {'zorse s':>7} {'predicted':>9} {'simulated':>9} {'heteroauto':>10} "
          f"{'ratio':>6}  plans")
    for name in args.clusters.split(","):
        cluster = load_cluster(f"configs/clusters/zorse-{name}.yaml")
        training = dataclasses.replace(cluster.training, micro_batch_size=1)
        for size in args.models.split(","):
            model = resolve_model(f"configs/models/llama-{size}.yaml")
            profiles = profiles_for(cluster, model, training, [])
            took, zorse, zorse_text = zorse_row(cluster, model, training, profiles, args.memory_fraction,
                                                args.min_groups, args.lone_group_ministages)
            hetero, hetero_text = None, "skipped"
            if not args.no_heteroauto:
                _, hetero, hetero_text = heteroauto_row(cluster, model, training, args.heteroauto_limit)
            predicted, simulated = zorse if zorse else (float("nan"), float("nan"))
            ratio = hetero / simulated if zorse and hetero else float("nan")
            print(
                f"{name:7} {size:5} {took:7.2f} {predicted:9.2f} {simulated:9.2f} "
                f"{hetero if hetero else float('nan'):10.2f} {ratio:6.2f}  zorse: {zorse_text}; "
                f"heteroauto: {hetero_text}", flush=True)


if __name__ == "__main__":
    main()
