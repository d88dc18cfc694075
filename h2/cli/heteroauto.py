"""`heteroauto`: search a strategy, simulate one, or profile chip types.

    heteroauto search   --cluster C [--model M] [--cost-model full|paper] [--time-limit S] [--out S.yaml] [--json]
                        [--exhaustive]
    heteroauto search   --planner zorse --cluster C [--model M] [--memory-fraction F] [--ministages K]
                        [--offload auto|on|off]
    heteroauto partition --cluster C [--json]
    heteroauto simulate --strategy S --cluster C [--cost-model full|paper] [--json] [--trace FILE]
    heteroauto profile  --cluster C [--chip NAME] [--model M] [--device cpu] [--synthesise]
                        [--out-dir D | --out P.yaml]
    heteroauto cross-site --scenario configs/xdc/gpt3-175b.yaml [--latency-ms 20] [--bandwidth-gbps B] [--limit K]
                          [--solver-division] [--json]

`search --planner zorse` plans with the Zorse planner (heteroauto.zorse: mixed-type groups, rows per
rank, ministages, ZeRO-2, offload; its flags are one argument group of `search`, refused without it);
`partition` prints its phase 1 (the min-k-cut of the cluster's bandwidth graph, every k); `simulate` scores
a Zorse strategy with the same simulator. `profile` measures by running the runtime's stage code on TP
ranks of each chip (heteropp.profiling; an emulated chip on its emulated dipu device) and writes one
profile file per chip type into the profile folder (default profiles/<cluster name>/), reusing a file
measured for the same chip entry, model and micro-batch shape unless --force; a profile measured while the
host made more than 5 % of its emulated kernel time late (h2.core.emulation.UNTRUSTED_FRACTION) is INVALID:
refused in one line, exit 2, nothing written, unless --force (then written marked `trusted: false`, and
measured again next time); `search` and `simulate` read that folder with --profiles.

The command parses, loads the cluster file once, calls the planner's functions (heteroauto.problem,
heteroauto.planning, heteroauto.profile_cache, heteroauto.predicted_trace) and the profiling job
(h2.launch.profiling_job), and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

from h2.core.cluster import ClusterSpec, load_cluster, parse_count
from h2.core.emulation import UNTRUSTED_FRACTION
from h2.core.errors import ArgumentParser, UserError, run_cli
from h2.core.model_config import ModelConfig
from h2.core.strategy import Strategy, load_strategy
from h2.launch.profiling_job import MeasureOptions, profile_chips
from heteroauto import planning
from heteroauto.evaluation import training_for
from heteroauto.planning import SearchOptions, SearchOutcome, SimulatedStrategy
from heteroauto.predicted_trace import write_strategy_trace, write_zorse_trace
from heteroauto.problem import PlanningProblem, TrainingOverrides, model_for, planning_problem
from heteroauto.profile_cache import check_output_file, cluster_folder, profile_report, profile_targets
from heteroauto.search import Progress
from heteroauto.stage_terms import COST_MODELS
from heteroauto.zorse.graph import bandwidth_graph, machines_of
from heteroauto.zorse.partition import split_partitions
from heteroauto.zorse.planner import OFFLOAD_CHOICES, ZorsePlan, rates_from_profiles
from heteroauto.zorse.planner import plan as zorse_plan
from heteroauto.zorse.scoring import simulate_plan
from heteroauto.zorse.strategies import from_strategy, is_zorse_strategy, to_strategy

GB = 1e9
MAX_REPLAY_MICRO_BATCHES = 1 << 16


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="heteroauto", description="HeteroAuto: strategy search for heterogeneous pipelines")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    def problem(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--cluster", required=True, help="cluster YAML (chip types, counts, links, training)")
        sub.add_argument("--model", help="model preset or YAML (default: the cluster file's `model`)")
        global_batch = sub.add_mutually_exclusive_group()
        global_batch.add_argument("--gbs-tokens", help="global batch in tokens, K/M suffixes (binary): 4M = 4 * 2^20")
        global_batch.add_argument("--gbs-sequences", help="global batch in sequences")
        sub.add_argument("--seq-len", type=int, help="sequence length")
        sub.add_argument("--micro-batch-size", type=int, help="sequences per micro-batch")
        sub.add_argument("--alpha", type=float, help="bubble coefficient: 1 for 1F1B, 0 for zero-bubble")
        sub.add_argument("--no-zero1", action="store_true", help="replicate optimizer states over dp")
        sub.add_argument("--profile", action="append", default=[], metavar="FILE",
                         help="measured profile of one chip type (repeatable); others are synthesised")
        sub.add_argument("--profiles", metavar="DIR",
                         help="a folder `heteroauto profile` wrote: the profile of every chip type found there")
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.add_argument("--cost-model", choices=COST_MODELS, default="full",
                         help="full: with embedding, head, stage-to-stage transfers (default); paper: the H2 paper's")

    search_cmd = commands.add_parser("search", help="find the best strategy")
    problem(search_cmd)
    search_cmd.add_argument("--out", help="write the best strategy here (YAML)")
    search_cmd.add_argument(
        "--planner", choices=("heteroauto", "zorse"), default="heteroauto",
        help="heteroauto: stages of one chip type with TP (default); zorse: groups of any chip "
        "types, rows per rank, ministages, ZeRO-2 and offload")
    _zorse_flags(search_cmd)
    search_cmd.add_argument(
        "--search", choices=("exact", "paper"),
        help="exact: every dp, stage order and tp sequence, a layer count per stage (default); "
        "paper: the paper's procedure and shortcuts (default with --cost-model paper)")
    search_cmd.add_argument("--top", type=int, default=1,
                            help="also list the K best plans (distinct dp, grouping, order)")
    search_cmd.add_argument("--exhaustive", action="store_true", help="the oracle: enumerate the whole space")
    search_cmd.add_argument("--group-size", type=int, default=128,
                            help="chips per group of a type, each with its own tp and recompute (0: whole types)")
    search_cmd.add_argument("--dp", type=int, help="fix the data-parallel size instead of searching it")
    search_cmd.add_argument("--monotone-tp", action="store_true",
                            help="tp may not grow along one type's groups (the paper's rule)")
    search_cmd.add_argument("--time-limit", type=float, metavar="S",
                            help="stop after S CPU seconds with the best plan so far and its proved gap")
    search_cmd.add_argument("--gap", type=float, default=0.0,
                            help="stop once no plan can be more than this fraction faster (default 0: optimal)")
    search_cmd.add_argument("--progress", action="store_true", help="show progress on stderr (default: on a terminal)")
    search_cmd.add_argument("--refine-all-dp", action="store_true",
                            help="--search paper: second stage at every dp, not only the first stage's (slower)")
    search_cmd.add_argument("--no-baselines", action="store_true",
                            help="skip the per-chip-type searches behind HeteroSpeedupRatio")
    search_cmd.add_argument(
        "--baseline-gbs-tokens", help="HeteroSpeedupRatio: global batch of each chip type trained alone (default: the "
        "cluster file's training.baseline_gbs_tokens, else the run's global batch)")
    search_cmd.add_argument(
        "--speedup-baseline", choices=planning.SPEEDUP_BASELINES, default="paper",
        help="paper: HeteroSpeedupRatio as the H2 paper defines it (every type alone with the "
        "same baseline batch); share: each type alone with its chip share of the run's batch, "
        "printed as the per-type-share ratio (default paper)")

    simulate_cmd = commands.add_parser("simulate", help="replay a strategy's pipeline schedule")
    problem(simulate_cmd)
    simulate_cmd.add_argument("--strategy", required=True)
    simulate_cmd.add_argument(
        "--no-overlap", action="store_true",
        help="a Zorse strategy: price HeteroPP's runtime (no overlap of ZeRO-2 traffic and "
        "offload copies with compute)")
    simulate_cmd.add_argument(
        "--grad-clip", type=float, default=1.0,
        help="a Zorse strategy: the run's max global gradient norm (h2 train --grad-clip, "
        "0: none) for the memory model (default 1.0)")
    simulate_cmd.add_argument("--no-transfers", action="store_true", help="stage-to-stage transfers take no time")
    simulate_cmd.add_argument("--trace", metavar="FILE",
                              help="write the predicted schedule as a Chrome/Perfetto trace (one track per stage)")

    cross_site_cmd = commands.add_parser(
        "cross-site", help="a pipeline across sites: 1F1B, JEEVES and one site, "
        "simulated (JEEVES, HotNets '25)")
    cross_site_cmd.add_argument("--scenario", required=True, help="the scenario file (configs/xdc/*.yaml)")
    cross_site_cmd.add_argument("--latency-ms", type=float, help="the cross-site link's one-way latency")
    cross_site_cmd.add_argument("--bandwidth-gbps", type=float, help="the cross-site link's bandwidth in GB/s")
    cross_site_cmd.add_argument(
        "--limit", type=int, metavar="K",
        help="activation memory for K micro-batches of a uniform stage (default: the chip's budget)")
    cross_site_cmd.add_argument(
        "--solver-division", action="store_true",
        help="also JEEVES on the division that minimises the paper's objective (section 3.2), solved by HiGHS")
    cross_site_cmd.add_argument("--json", action="store_true")
    partition_cmd = commands.add_parser(
        "partition", help="Zorse's phase 1: the cluster's machines cut into k "
        "groups for every k (min-k-cut of the bandwidth graph)")
    partition_cmd.add_argument("--cluster", required=True, help="cluster YAML")
    partition_cmd.add_argument("--json", action="store_true", help="print one JSON object")

    profile_cmd = commands.add_parser(
        "profile", help="profile the cluster's chip types (measured by running TP ranks "
        "of each, or synthesised)")
    problem(profile_cmd)
    profile_cmd.add_argument("--chip", help="only this chip type (default: every chip type of the cluster)")
    profile_cmd.add_argument(
        "--device", default="cpu",
        help="torch device of chips without emulation (cpu, dipu, ...); an emulated chip runs "
        "on its emulated dipu device")
    profile_cmd.add_argument("--synthesise", action="store_true",
                             help="derive from the spec sheet instead of measuring")
    profile_cmd.add_argument("--repeats", type=int, default=5, help="timed rounds per measurement (median)")
    profile_cmd.add_argument("--out-dir", metavar="DIR", help="profile folder (default profiles/<cluster name>)")
    profile_cmd.add_argument("--out", metavar="FILE", help="with --chip: write this file instead of DIR/<chip>.yaml")
    profile_cmd.add_argument(
        "--force", action="store_true", help="measure again even where a profile is up to date, and write a "
        f"profile measured with more than {UNTRUSTED_FRACTION:.0%}% of its emulated kernel time late (refused "
        "otherwise, exit 2) marked 'trusted: false'")
    profile_cmd.add_argument(
        "--max-late", type=float, default=UNTRUSTED_FRACTION, metavar="FRACTION",
        help="measure a TP size again when more than this fraction of its emulated kernel time "
        f"was late (the host's load, not the chip); default {UNTRUSTED_FRACTION:g}")
    profile_cmd.add_argument("--attempts", type=int, default=2,
                             help="measurements of one TP size at most; the least late is kept (default 2)")
    return parser


def _zorse_flags(search_cmd: argparse.ArgumentParser) -> None:
    """The Zorse planner's own flags, in their own group: refused without --planner zorse."""
    zorse = search_cmd.add_argument_group(
        "the Zorse planner (--planner zorse)", "groups of any chip types, rows per rank, ministages, ZeRO-2 and "
        "offload (heteroauto.zorse)")
    actions = [
        zorse.add_argument("--memory-fraction", type=float, default=1.0,
                           help="plan within this fraction of each chip's usable memory"),
        zorse.add_argument("--ministages", type=int, help="fix the ministages per group"),
        zorse.add_argument("--offload", choices=OFFLOAD_CHOICES, default="auto",
                           help="activations and parameter shards to host memory (auto: try both)"),
        zorse.add_argument("--max-groups", type=int,
                           help="at most this many pipeline groups (1: one data-parallel group)"),
        zorse.add_argument("--min-groups", type=int, default=1,
                           help="at least this many pipeline groups (2: no plan of one group of all machines)"),
        zorse.add_argument(
            "--lone-group-ministages", action="store_true",
            help="a plan of one group may take several ministages too (ZeRO-3 with layer-wise "
            "accumulation; default: one, as in the Zorse authors' planner, where ministages "
            "interleave a pipeline of several groups)"),
        zorse.add_argument(
            "--no-overlap", action="store_true",
            help="price HeteroPP's runtime, which overlaps no ZeRO-2 traffic or offload copy with "
            "compute (default: Zorse's, which does)"),
        zorse.add_argument(
            "--grad-clip", type=float, default=1.0,
            help="the run's max global gradient norm (h2 train --grad-clip), 0 if it does not clip: "
            "with clipping each rank holds its reduced gradients until the last backward "
            "(default 1.0, h2 train's)"),
    ]
    search_cmd.set_defaults(zorse_actions=tuple(actions))


def _listed(flags: list[str]) -> str:
    return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " and " + flags[-1]


def _check_planner_flags(args) -> None:
    """Each planner's flags only with that planner: one line naming them, exit 2."""
    if args.planner == "zorse":
        if args.exhaustive or args.search is not None or args.dp is not None:
            raise UserError("--exhaustive, --search and --dp: only with --planner heteroauto")
    elif any(getattr(args, action.dest) != action.default for action in args.zorse_actions):
        zorse = [action.option_strings[0] for action in args.zorse_actions]
        raise UserError(f"{_listed(zorse)}: only with --planner zorse")


# ---- loading the problem -------------------------------------------------------------------------
def _overrides(args) -> TrainingOverrides:
    """What the flags change in the cluster file's `training`."""
    return TrainingOverrides(
        seq_len=args.seq_len, micro_batch_size=args.micro_batch_size, alpha=args.alpha, no_zero1=args.no_zero1,
        global_batch_tokens=None if args.gbs_tokens is None else parse_count(args.gbs_tokens, "--gbs-tokens"),
        global_batch_sequences=(None
                                if args.gbs_sequences is None else parse_count(args.gbs_sequences, "--gbs-sequences")))


def _problem(args, cluster: ClusterSpec | None = None, default_model: ModelConfig | None = None,
             default_seq_len: int | None = None) -> PlanningProblem:
    """The cluster (loaded here unless given), the model (--model, else `default_model`, else the cluster
    file's), the training spec (the cluster file's `training` with the flags applied) and the profiles
    (--profile files and the --profiles folder)."""
    cluster = cluster or load_cluster(args.cluster)
    model = model_for(cluster, args.model, default_model)
    return planning_problem(cluster, model, _overrides(args), args.profile, args.profiles, default_seq_len)


def _emulated(cluster, name: str) -> str:
    return " (emulated)" if cluster.chip(name).emulated else ""


# ---- search --------------------------------------------------------------------------------------
MAX_TOP = 1000
MAX_GROUP_SIZE = 1 << 24


def _search_options(args) -> SearchOptions:
    """The search's settings from the flags, each checked (one line, exit 2, when out of range)."""
    if not 1 <= args.top <= MAX_TOP:
        raise UserError(f"--top: must be between 1 and {MAX_TOP}, got {args.top}")
    if not 0 <= args.group_size <= MAX_GROUP_SIZE:
        raise UserError(f"--group-size: must be 0 (whole types) or a chip count up to {MAX_GROUP_SIZE}, "
                        f"got {args.group_size}")
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise UserError(f"--time-limit: must be a positive number of seconds, got {args.time_limit}")
    if not (math.isfinite(args.gap) and 0 <= args.gap < 1):
        raise UserError(f"--gap: must be a fraction in [0, 1), got {args.gap}")
    method = args.search or ("paper" if args.cost_model == "paper" else "exact")
    if method == "exact" and args.refine_all_dp:
        raise UserError("--refine-all-dp: only with --search paper (the exact search tries every dp)")
    if method == "paper" and (args.monotone_tp or args.time_limit is not None or args.gap):
        raise UserError("--monotone-tp, --time-limit and --gap: only with --search exact (the paper's procedure "
                        "always keeps tp monotone and has no bound to report)")
    return SearchOptions(method="exhaustive" if args.exhaustive else method, cost_model=args.cost_model, top_k=args.top,
                         group_size=args.group_size or None, dp=args.dp, monotone_tp=args.monotone_tp,
                         time_limit_s=args.time_limit, gap=args.gap, refine_all_dp=args.refine_all_dp)


def _show_progress(progress: Progress) -> None:
    gap = progress.best_s / progress.lower_bound_s - 1 if 0 < progress.lower_bound_s < math.inf else math.inf
    line = (f"heteroauto: searching {progress.elapsed_s:6.1f} s, dp/grouping {progress.items_done}/{progress.items}, "
            f"{progress.orders_done} stage orders solved, best {progress.best_s:.4g} s, gap <= " +
            (f"{gap * 100:.2f}%" if math.isfinite(gap) else "?"))
    if sys.stderr.isatty():
        print("\r" + line, end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def _searched(args, problem: PlanningProblem) -> SearchOutcome:
    """The search the flags ask for on `problem`, with progress on stderr (--progress, or a terminal)."""
    progress = _show_progress if (args.progress or sys.stderr.isatty()) else None
    baseline_tokens = (parse_count(args.baseline_gbs_tokens, "--baseline-gbs-tokens")
                       if args.baseline_gbs_tokens is not None else None)
    if baseline_tokens is not None and args.speedup_baseline == "share":
        raise UserError("--baseline-gbs-tokens sets the paper's baseline batch; --speedup-baseline share takes none")
    outcome = planning.search_strategy(problem, _search_options(args), baselines=not args.no_baselines,
                                       baseline_tokens=baseline_tokens, speedup_baseline=args.speedup_baseline,
                                       progress=progress)
    if progress is not None and outcome.result is not None and sys.stderr.isatty():
        print(file=sys.stderr)
    return outcome


def _search_payload(outcome: SearchOutcome, problem: PlanningProblem) -> dict:
    """`heteroauto search --json`'s object."""
    cluster, training, strategy, report, result = (problem.cluster, problem.training, outcome.strategy, outcome.report,
                                                   outcome.result)
    rows = [{
        "chip": s.chip, "emulated": cluster.chip(s.chip).emulated, "tp": s.tp, "dp": s.dp, "layers": s.layers,
        "recompute": s.recompute, "memory_gb": s.memory_bytes / GB, "capacity_gb": s.capacity_bytes / GB,
        "compute_s": s.compute_s, "update_s": s.update_s, "send_s": s.terms.send_s
    } for s in report.stages]
    return {
        "strategy": {
            "dp": strategy.dp, "micro_batches": strategy.micro_batches, "micro_batch_size": strategy.micro_batch_size,
            "seq_len": strategy.seq_len, "schedule": strategy.schedule, "model": problem.model.name, "stages": rows
        },
        "iteration_s": report.iteration_s,
        "tokens_per_chip_s": report.tokens_per_chip_s,
        "hetero_speedup_ratio": outcome.hetero_speedup_ratio,
        "speedup_baseline": outcome.speedup_baseline,
        "baselines": outcome.baselines,
        "cost_model": outcome.options.cost_model,
        "search": outcome.method,
        "optimal": outcome.optimal,
        "gap": outcome.gap,
        "timed_out": outcome.timed_out,
        "lower_bound_s": outcome.lower_bound_s,
        "search_s": outcome.search_s,
        "search_cpu_s": outcome.search_cpu_s,
        "evaluated": outcome.evaluated,
        "bounded": outcome.bounded,
        "exhaustive": outcome.method == "exhaustive",
        "gbs_tokens": training.tokens,
        "alpha": training.alpha,
        "top": [] if result is None else [{
            "iteration_s": c.objective_s, "dp": c.dp, "order": list(c.order), "groups": [g.label for g in c.groups],
            "tp": list(c.tps), "pp": list(c.pps), "recompute": list(
                c.recompute), "stage_layers": [list(x) for x in c.stage_layers]
        } for c in result.top],
    }


def _print_search(args, outcome: SearchOutcome, problem: PlanningProblem) -> None:
    cluster, model, training, strategy, report = (problem.cluster, problem.model, problem.training, outcome.strategy,
                                                  outcome.report)
    print(f"cluster {cluster.name}: {cluster.total_chips} chips (" +
          ", ".join(f"{c.name}={c.count}{' emulated' if c.emulated else ''}" for c in cluster.chips) +
          f"), model {model.name}, global batch {training.tokens} tokens ({training.sequences} x {training.seq_len}), "
          f"alpha {training.alpha:g}, cost model {args.cost_model}")
    print(f"strategy: dp={strategy.dp} micro_batches={strategy.micro_batches} "
          f"micro_batch_size={strategy.micro_batch_size} pp={len(strategy.stages)} schedule={strategy.schedule}")
    print(f"{'stage':>5} {'chip':>6} {'tp':>3} {'dp':>4} {'layers':>6} {'recomp':>6} {'memory GB':>10} {'cap GB':>7} "
          f"{'T_comp s':>9} {'T_upd s':>8} {'send s':>8}")
    for s in report.stages:
        print(f"{s.index:>5} {s.chip:>6} {s.tp:>3} {s.dp:>4} {s.layers:>6} {'on' if s.recompute else 'off':>6} "
              f"{s.memory_bytes / GB:>10.4g} {s.capacity_bytes / GB:>7.4g} {s.compute_s:>9.4f} {s.update_s:>8.4f} "
              f"{s.terms.send_s:>8.4f}{_emulated(cluster, s.chip)}")
    print(f"predicted iteration: {report.iteration_s:.3f} s   tokens/chip/s: {report.tokens_per_chip_s:.2f}")
    _print_speedup_ratio(args, outcome)
    for rank, c in enumerate(outcome.result.top[1:] if outcome.result else [], start=2):
        print(f"#{rank}: {c.objective_s:.3f} s dp={c.dp} order={'>'.join(c.order)} tp={list(c.tps)} "
              f"recompute={[int(r) for r in c.recompute]} stage layers={[list(x) for x in c.stage_layers]}")
    print(f"search ({outcome.method}): {outcome.search_s:.3f} s ({outcome.search_cpu_s:.3f} s CPU), "
          f"{outcome.evaluated} evaluated, {outcome.bounded} skipped by bounds; {_proof(outcome)}")


def _count_text(value: int) -> str:
    """A count as parse_count reads it back: 2097152 -> '2M'."""
    for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value % scale == 0:
            return f"{value // scale}{suffix}"
    return str(value)


def _print_speedup_ratio(args, outcome: SearchOutcome) -> None:
    ratio, baselines = outcome.hetero_speedup_ratio, outcome.baselines
    name = "HeteroSpeedupRatio" if outcome.speedup_baseline == "paper" else "per-type-share HeteroSpeedupRatio"
    if ratio is not None:
        alone = ", ".join(
            f"{chip} {b['tokens_per_chip_s']:.2f} at {_count_text(b['gbs_tokens'])} tokens" +
            (f" (rounded from {b['rounded_from_sequences']} sequences)" if "rounded_from_sequences" in b else "")
            for chip, b in baselines.items())
        print(f"{name}: {ratio * 100:.2f}%  (each type alone, same search: tokens/chip/s {alone})")
    elif baselines:
        print(f"{name}: n/a (" + "; ".join(f"{k}: {v.get('error')}"
                                           for k, v in baselines.items() if 'error' in v) + ")")


def _proof(outcome: SearchOutcome) -> str:
    """What the search proved about its plan."""
    if outcome.method == "exact":
        if outcome.optimal:
            return "proved optimal"
        return (f"{'time limit reached; ' if outcome.timed_out else ''}within {outcome.gap * 100:.2f}% of the optimum "
                f"(proved lower bound {outcome.lower_bound_s:.4g} s)")
    return "exhaustive" if outcome.method == "exhaustive" else "the paper's procedure: no optimality bound"


def _cmd_search(args) -> int:
    if args.out:
        check_output_file(args.out, "--out")
    _check_planner_flags(args)
    if args.planner == "zorse":
        return _cmd_search_zorse(args)
    problem = _problem(args)
    outcome = _searched(args, problem)
    if args.out:
        outcome.strategy.save(args.out)
    if args.json:
        print(json.dumps(_search_payload(outcome, problem)))
        return 0
    _print_search(args, outcome, problem)
    if args.out:
        print(f"wrote {args.out}")
    return 0


# ---- zorse ---------------------------------------------------------------------------------------
def _zorse_problem(args, memory_fraction: float = 1.0, default_model: ModelConfig | None = None, default_seq_len: int
                   | None = None, strategy: Strategy | None = None) -> tuple[PlanningProblem, dict]:
    """The problem with one sequence per profiled micro-batch (of `strategy`'s shape when given), and the
    chip rates within --memory-fraction of each chip's usable memory."""
    problem = _problem(args, default_model=default_model, default_seq_len=default_seq_len)
    training = problem.training if strategy is None else training_for(strategy, problem.training)
    problem = problem.with_training(dataclasses.replace(training, micro_batch_size=1))
    if not (math.isfinite(memory_fraction) and 0 < memory_fraction <= 1):
        raise UserError(f"--memory-fraction: must be in (0, 1], got {memory_fraction}")
    return problem, rates_from_profiles(problem.cluster, problem.profiles(), memory_fraction)


def _plan_payload(plan: ZorsePlan, cluster: ClusterSpec, simulated_s: float) -> dict:
    return {
        "planner": "zorse", "iteration_s": plan.latency.iteration_s, "simulated_iteration_s": simulated_s,
        "startup_s": plan.latency.startup_s, "steady_s": plan.latency.steady_s, "drain_s": plan.latency.drain_s,
        "bottleneck": plan.latency.bottleneck, "micro_batch_sequences": plan.micro_batch_sequences,
        "micro_batches": plan.micro_batches, "ministages": plan.ministages, "offload": plan.offload,
        "recompute": plan.recompute, "overlap": plan.overlap, "max_memory_fraction": plan.max_memory_fraction,
        "groups": [{
            "machines": [m.name
                         for m in g.machines], "regions": sorted(g.regions), "chips": list(g.chips), "emulated": [
                             cluster.chip(c).emulated for c in g.chips
                         ], "rows": list(g.rows), "ministage_layers": list(g.ministage_layers), "memory_gb": [
                             m.device_bytes / GB for m in g.memory
                         ], "host_gb": [m.host_bytes / GB
                                        for m in g.memory], "capacity_gb": [m.capacity_bytes / GB for m in g.memory]
        } for g in plan.groups]
    }


def _print_plan(plan: ZorsePlan, cluster: ClusterSpec, simulated_s: float) -> None:
    print(f"zorse plan: {len(plan.groups)} groups, {plan.micro_batches} micro-batches of {plan.micro_batch_sequences} "
          f"sequences, {plan.ministages} ministages per group, ZeRO-2, offload {'on' if plan.offload else 'off'}, "
          f"recompute {'on' if plan.recompute else 'off'}, communication "
          f"{'overlapped with compute (Zorse)' if plan.overlap else 'not overlapped (HeteroPP runtime)'}")
    print(f"{'group':>5} {'gpus':>4} {'layers':>6} {'memory GB':>10} {'cap GB':>7}  machines (region): chip x rows")
    for index, group in enumerate(plan.groups):
        worst = max(group.memory, key=lambda m: m.fraction)
        kinds: dict[tuple[str, int], int] = {}
        for chip, rows in zip(group.chips, group.rows):
            kinds[(chip, rows)] = kinds.get((chip, rows), 0) + 1
        ranks = ", ".join(f"{n} {chip}{' (emulated)' if cluster.chip(chip).emulated else ''} x {rows} rows"
                          for (chip, rows), n in kinds.items())
        print(f"{index:>5} {len(group.chips):>4} {group.layers:>6} {worst.device_bytes / GB:>10.4g} "
              f"{worst.capacity_bytes / GB:>7.4g}  {' '.join(m.name for m in group.machines)} "
              f"({', '.join(sorted(group.regions))}): {ranks}")
    latency = plan.latency
    print(f"predicted iteration: {latency.iteration_s:.3f} s (start-up {latency.startup_s:.3f} + steady "
          f"{latency.steady_s:.3f} + drain {latency.drain_s:.3f}, set by {latency.bottleneck}); simulated: "
          f"{simulated_s:.3f} s")


def _check_grad_clip(args) -> None:
    if not (args.grad_clip >= 0 and math.isfinite(args.grad_clip)):
        raise UserError(f"--grad-clip: must be a finite number at least 0 (0: no clipping), got {args.grad_clip}")


def _check_zorse_search_flags(args) -> None:
    if args.ministages is not None and args.ministages < 1:
        raise UserError(f"--ministages: must be at least 1, got {args.ministages}")
    _check_grad_clip(args)


def _check_group_counts(args) -> None:
    if args.max_groups is not None and args.max_groups < 1:
        raise UserError(f"--max-groups: must be at least 1, got {args.max_groups}")
    if args.min_groups < 1 or (args.max_groups is not None and args.min_groups > args.max_groups):
        raise UserError(f"--min-groups: must be at least 1 and at most --max-groups, got {args.min_groups}")


def _zorse_searched(args, problem: PlanningProblem, rates: dict):
    """Zorse's plan search with the flags' settings, and how long it took."""
    started = time.perf_counter()
    found = zorse_plan(problem.cluster, problem.model, problem.training, rates, ministages=args.ministages,
                       offload=args.offload, overlap=not args.no_overlap, max_groups=args.max_groups,
                       min_groups=args.min_groups, lone_group_ministages=args.lone_group_ministages,
                       grad_clip=args.grad_clip)
    return found, time.perf_counter() - started


def _cmd_search_zorse(args) -> int:
    _check_zorse_search_flags(args)
    problem, rates = _zorse_problem(args, args.memory_fraction)
    _check_group_counts(args)
    found, searched_s = _zorse_searched(args, problem, rates)
    cluster, model, training = problem.cluster, problem.model, problem.training
    simulated = simulate_plan(found.best, rates, model, training).iteration_s
    strategy = to_strategy(found.best, model)
    if args.out:
        strategy.save(args.out)
    if args.json:
        print(
            json.dumps({
                **_plan_payload(found.best, cluster, simulated), "search_s": searched_s, "evaluated": found.evaluated,
                "strategy": strategy.to_dict()
            }))
        return 0
    print(f"cluster {cluster.name}: {cluster.total_chips} chips on {len(machines_of(cluster))} machines, model "
          f"{model.name}, global batch {training.tokens} tokens ({training.sequences} x {training.seq_len})")
    _print_plan(found.best, cluster, simulated)
    print(f"search (zorse): {searched_s:.3f} s, {found.evaluated} candidates evaluated over "
          f"{len(found.partitions)} partitions")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def _partition_rows(cluster: ClusterSpec, machines: list) -> list[dict]:
    """Zorse's phase 1: the machines cut into k groups for every k, each group's machines, regions and chips."""
    partitions = split_partitions(bandwidth_graph(cluster, machines), f"{cluster.source}: bandwidth graph")

    def describe(group) -> dict:
        chips: dict[str, int] = {}
        for index in group:
            for chip in machines[index].chips:
                chips[chip] = chips.get(chip, 0) + 1
        return {
            "machines": [machines[i].name for i in group], "regions": sorted({machines[i].region
                                                                              for i in group}), "chips": chips
        }

    return [{"k": p.k, "cut_gbps": p.cut_weight, "groups": [describe(g) for g in p.groups]} for p in partitions]


def _cmd_partition(args) -> int:
    cluster = load_cluster(args.cluster)
    machines = machines_of(cluster)
    rows = _partition_rows(cluster, machines)
    if args.json:
        print(json.dumps({"cluster": cluster.name, "partitions": rows}))
        return 0
    print(f"cluster {cluster.name}: {len(machines)} machines, {cluster.total_chips} chips; SPLIT min-k-cut of the "
          f"bandwidth graph (edge weight: GPU pairs x GB/s), within 2 - 2/k of the optimal cut")
    for row in rows:
        groups = " | ".join(f"{'+'.join(g['machines'])} ({', '.join(f'{n} {c}' for c, n in g['chips'].items())})"
                            for g in row["groups"])
        print(f"k={row['k']:<3} cut {row['cut_gbps']:>10.4g} GB/s  {groups}")
    return 0


# ---- simulate ------------------------------------------------------------------------------------
def _cmd_simulate_zorse(args, strategy: Strategy) -> int:
    problem, rates = _zorse_problem(args, default_model=strategy.model_config(args.strategy),
                                    default_seq_len=strategy.seq_len, strategy=strategy)
    cluster, model, training = problem.cluster, problem.model, problem.training
    _check_grad_clip(args)
    scored = from_strategy(strategy, cluster, model, training, rates, args.strategy, overlap=not args.no_overlap,
                           grad_clip=args.grad_clip)
    replay = simulate_plan(scored, rates, model, training, keep_timeline=args.trace is not None)
    simulated = replay.iteration_s
    if args.trace is not None:
        write_zorse_trace(args.trace, replay, scored)
    if args.json:
        print(
            json.dumps({
                **_plan_payload(scored, cluster, simulated), "iteration_s": simulated,
                "latency_model_iteration_s": scored.latency.iteration_s, "fits": scored.max_memory_fraction <= 1
            }))
        return 0
    print(f"strategy {args.strategy}: Zorse groups priced by the Zorse latency and memory models, replayed by the "
          f"simulator")
    _print_plan(scored, cluster, simulated)
    return 0


def _simulate_payload(args, result: SimulatedStrategy, cluster: ClusterSpec) -> dict:
    """`heteroauto simulate --json`'s object."""
    strategy, report, sim = result.strategy, result.report, result.simulation
    return {
        "iteration_s": sim.iteration_s, "cost_model_iteration_s": report.iteration_s, "cost_model": args.cost_model,
        "tokens_per_chip_s": result.training.tokens / sim.iteration_s / report.chips, "schedule": strategy.schedule,
        "micro_batches": strategy.micro_batches, "transfers": sim.transfers, "simulate_s": result.simulate_s,
        "fits": report.fits, "stages": [{
            "chip": s.chip, "emulated": cluster.chip(s.chip).emulated, "tp": s.tp, "dp": s.dp, "layers": s.layers,
            "recompute": s.recompute, "busy_s": busy, "bubble_s": bubble, "update_s": s.update_s, "send_s": term.send_s,
            "memory_gb": s.memory_bytes / GB, "capacity_gb": s.capacity_bytes / GB
        } for s, term, busy, bubble in zip(report.stages, result.terms, sim.busy_s, sim.bubble_s)]
    }


def _print_simulation(args, result: SimulatedStrategy, cluster: ClusterSpec, tokens_per_chip_s: float) -> None:
    strategy, report, sim = result.strategy, result.report, result.simulation
    print(f"strategy {args.strategy}: {len(strategy.stages)} stages, dp={strategy.dp}, "
          f"{strategy.micro_batches} micro-batches, schedule {strategy.schedule}, cost model {args.cost_model}")
    print(f"{'stage':>5} {'chip':>6} {'tp':>3} {'dp':>3} {'layers':>6} {'busy s':>10} {'bubble s':>10} "
          f"{'update s':>9} {'send s':>8} {'memory GB':>10} {'cap GB':>7}")
    for s, term, busy, bubble in zip(report.stages, result.terms, sim.busy_s, sim.bubble_s):
        flag = "" if s.fits else "  OVER CAPACITY"
        print(f"{s.index:>5} {s.chip:>6} {s.tp:>3} {s.dp:>3} {s.layers:>6} {busy:>10.4f} {bubble:>10.4f} "
              f"{s.update_s:>9.4f} {term.send_s:>8.4f} {s.memory_bytes / GB:>10.4g} {s.capacity_bytes / GB:>7.4g}{flag}"
              f"{_emulated(cluster, s.chip)}")
    print(f"simulated iteration: {sim.iteration_s:.4f} s "
          f"({'no transfers' if args.no_transfers else f'{sim.transfers} transfers'}); "
          f"cost model: {report.iteration_s:.4f} s; tokens/chip/s: {tokens_per_chip_s:.2f}")


def _cmd_simulate(args) -> int:
    strategy = load_strategy(args.strategy)
    if is_zorse_strategy(strategy):
        return _cmd_simulate_zorse(args, strategy)
    if args.grad_clip != 1.0:
        raise UserError(f"--grad-clip: only for a Zorse strategy (ministages, ZeRO-2, offload or mixed-type "
                        f"groups); {args.strategy} is none")
    problem = _problem(args, default_model=strategy.model_config(args.strategy), default_seq_len=strategy.seq_len)
    if strategy.micro_batches > MAX_REPLAY_MICRO_BATCHES:
        raise UserError(f"{args.strategy}: field 'micro_batches': the replay takes at most "
                        f"{MAX_REPLAY_MICRO_BATCHES} micro-batches, got {strategy.micro_batches}")
    result = planning.simulate_strategy(problem, strategy, args.strategy, cost_model=args.cost_model,
                                        alpha_given=args.alpha is not None, transfers=not args.no_transfers,
                                        keep_timeline=args.trace is not None)
    if result.generated and not args.json:
        print(result.generated)
    if args.trace is not None:
        write_strategy_trace(args.trace, result.simulation, result.report, result.strategy.schedule)
    payload = _simulate_payload(args, result, problem.cluster)
    if args.json:
        print(json.dumps(payload))
        return 0
    _print_simulation(args, result, problem.cluster, payload["tokens_per_chip_s"])
    return 0


# ---- profile ------------------------------------------------------------------------------------
def _cmd_profile(args) -> int:
    problem = _problem(args)
    options = MeasureOptions(device=args.device, repeats=args.repeats, attempts=args.attempts, max_late=args.max_late)
    targets = profile_targets(problem.cluster, args.out_dir or cluster_folder(problem.cluster), args.chip, args.out)
    profiled = profile_chips(problem.cluster, problem.model, problem.training, targets, options, force=args.force,
                             synthesise=args.synthesise)
    if args.json:
        print(json.dumps({target.chip.name: profiled.profiles[target.chip.name].to_dict() for target in targets}))
        return 0
    for target in targets:
        name = target.chip.name
        print(profile_report(profiled.profiles[name], target, profiled.how[name]))
    return 0


# ---- cross-site ----------------------------------------------------------------------------------
def _cross_site_scenario(args):
    """The scenario file with the flags' link and in-flight limit applied, each flag checked."""
    from heteroauto.cross_site import load_scenario

    for flag, value in (("--latency-ms", args.latency_ms), ("--bandwidth-gbps", args.bandwidth_gbps)):
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise UserError(f"{flag} must be a number >= 0, got {value:g}")
    if args.bandwidth_gbps == 0:
        raise UserError("--bandwidth-gbps must be > 0, got 0")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit: the in-flight limit K must be >= 1 (one micro-batch), got {args.limit}")
    scenario = load_scenario(args.scenario)
    if args.limit is not None:
        scenario = scenario.with_limit(args.limit)
    return scenario.with_link(latency_ms=args.latency_ms, bandwidth_gbps=args.bandwidth_gbps)


def _cmd_cross_site(args) -> int:
    from heteroauto.cross_site import compare

    scenario = _cross_site_scenario(args)
    started = time.perf_counter()
    report = compare(scenario, solver_division=args.solver_division)
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps({**report.to_dict(), "simulate_s": elapsed}))
        return 0
    p = scenario.pipeline
    print(f"{scenario.source}: {p.replicas} replicas x {p.stages} stages x TP{p.tensor_parallel}, {p.micro_batches} "
          f"micro-batches each, {scenario.chip.name}; cross-site link {report.bandwidth_gbps:g} GB/s, "
          f"{report.latency_ms:g} ms (simulated)")
    runs = (report.one_f_one_b, report.uncoordinated, report.jeeves, report.jeeves_solver, report.jeeves_equal_memory,
            report.one_site)
    for run in runs:
        if run is None:
            continue
        fits = "" if run.fits else "  (does not fit the activation budget)"
        print(f"  {run.name:32s} {run.iteration_s:8.3f} s   layers {list(run.layers)}  peak in flight "
              f"{run.peak_in_flight}{fits}")
    bounds = report.jeeves.bounds
    print(f"  critical-path bound (jeeves' division): compute {bounds.compute_s:.3f} s, communication "
          f"{bounds.communication_s:.3f} s")
    print(f"  jeeves saves {report.saving:.1%} against 1f1b with the scenario's activation budget, "
          f"{report.equal_memory_saving:.1%} at equal memory (held to the {max(report.one_f_one_b.peak_in_flight)} "
          f"micro-batches 1f1b holds); {report.jeeves.iteration_s / report.one_site.iteration_s:.3f}x "
          f"the one-site time; simulated in {elapsed:.1f} s")
    return 0


@run_cli("heteroauto")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return {
        "search": _cmd_search, "simulate": _cmd_simulate, "profile": _cmd_profile, "cross-site": _cmd_cross_site,
        "partition": _cmd_partition
    }[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
