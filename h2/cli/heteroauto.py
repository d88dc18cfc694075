"""`heteroauto`: search a strategy, simulate one, or profile chip types.

    heteroauto search   --cluster C [--model M] [--cost-model full|paper] [--time-limit S] [--out S.yaml] [--json] [--exhaustive]
    heteroauto search   --planner zorse --cluster C [--model M] [--memory-fraction F] [--ministages K] [--offload auto|on|off]
    heteroauto partition --cluster C [--json]
    heteroauto simulate --strategy S --cluster C [--cost-model full|paper] [--json] [--trace FILE]
    heteroauto profile  --cluster C [--chip NAME] [--model M] [--device cpu] [--synthesise] [--out-dir D | --out P.yaml]
    heteroauto cross-site --scenario configs/xdc/gpt3-175b.yaml [--latency-ms 20] [--bandwidth-gbps B] [--limit K] [--json]

`search --planner zorse` plans with the Zorse planner (heteroauto.zorse: mixed-type groups, rows per
rank, ministages, ZeRO-2, offload); `partition` prints its phase 1 (the min-k-cut of the cluster's
bandwidth graph, every k); `simulate` scores a Zorse strategy with the same simulator.
`profile` measures by running the runtime's stage code on TP ranks of each chip (heteropp.profiling;
an emulated chip on its emulated dipu device) and writes one profile file per chip type into the
profile folder (default profiles/<cluster name>/), reusing a file measured for the same chip entry,
model and micro-batch shape unless --force; `search` and `simulate` read that folder with --profiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec, load_cluster, parse_count
from h2.core.devices import resolve_device
from h2.core.emulation import check_core_share, describe_chip, host_cores
from h2.core.errors import ArgumentParser, UserError, run_cli
from h2.core.model_config import ModelConfig, resolve_model
from h2.core.schedule import schedule_actions
from h2.core.stage_orders import run_schedule
from h2.core.strategy import load_strategy
from heteroauto import paper_search
from heteroauto.evaluation import evaluate_strategy, training_for
from heteroauto.jeeves_plan import site_terms, with_schedule_orders
from heteroauto.oracle import oracle_search
from heteroauto.profiles import (load_profile, measured_profile, profile_fingerprint, profiles_for, save_profile,
                                    synthesise_profile)
from heteroauto.search import Progress, search
from heteroauto.simulator import simulate
from heteroauto.stage_terms import COST_MODELS
from heteroauto.zorse.graph import bandwidth_graph, machines_of
from heteroauto.zorse.partition import split_partitions
from heteroauto.zorse.planner import OFFLOAD_CHOICES, ZorsePlan, plan as zorse_plan, rates_from_profiles
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
    search_cmd.add_argument("--planner", choices=("heteroauto", "zorse"), default="heteroauto",
                            help="heteroauto: stages of one chip type with TP (default); zorse: groups of any chip "
                                 "types, rows per rank, ministages, ZeRO-2 and offload")
    search_cmd.add_argument("--memory-fraction", type=float, default=1.0,
                            help="--planner zorse: plan within this fraction of each chip's usable memory")
    search_cmd.add_argument("--ministages", type=int, help="--planner zorse: fix the ministages per group")
    search_cmd.add_argument("--max-groups", type=int,
                            help="--planner zorse: at most this many pipeline groups (1: one data-parallel group)")
    search_cmd.add_argument("--lone-group-ministages", action="store_true",
                            help="--planner zorse: a plan of one group may take several ministages too (ZeRO-3 "
                                 "with layer-wise accumulation; default: one, as in the Zorse authors' planner, "
                                 "where ministages interleave a pipeline of several groups)")
    search_cmd.add_argument("--min-groups", type=int, default=1,
                            help="--planner zorse: at least this many pipeline groups (2: no plan of one group "
                                 "of all machines)")
    search_cmd.add_argument("--no-overlap", action="store_true",
                            help="--planner zorse: price HeteroPP's runtime, which overlaps no ZeRO-2 traffic or "
                                 "offload copy with compute (default: Zorse's, which does)")
    search_cmd.add_argument("--grad-clip", type=float, default=1.0,
                            help="--planner zorse: the run's max global gradient norm (h2 train --grad-clip), 0 "
                                 "if it does not clip: with clipping each rank holds its reduced gradients "
                                 "until the last backward (default 1.0, h2 train's)")
    search_cmd.add_argument("--offload", choices=OFFLOAD_CHOICES, default="auto",
                            help="--planner zorse: activations and parameter shards to host memory (auto: try both)")
    search_cmd.add_argument("--search", choices=("exact", "paper"),
                            help="exact: every dp, stage order and tp sequence, a layer count per stage (default); "
                                 "paper: the paper's procedure and shortcuts (default with --cost-model paper)")
    search_cmd.add_argument("--top", type=int, default=1, help="also list the K best plans (distinct dp, grouping, order)")
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
    search_cmd.add_argument("--baseline-gbs-tokens",
                            help="global batch of each chip type trained alone (default: its chip share of the batch)")

    simulate_cmd = commands.add_parser("simulate", help="replay a strategy's pipeline schedule")
    problem(simulate_cmd)
    simulate_cmd.add_argument("--strategy", required=True)
    simulate_cmd.add_argument("--no-overlap", action="store_true",
                              help="a Zorse strategy: price HeteroPP's runtime (no overlap of ZeRO-2 traffic and "
                                   "offload copies with compute)")
    simulate_cmd.add_argument("--grad-clip", type=float, default=1.0,
                              help="a Zorse strategy: the run's max global gradient norm (h2 train --grad-clip, "
                                   "0: none) for the memory model (default 1.0)")
    simulate_cmd.add_argument("--no-transfers", action="store_true", help="stage-to-stage transfers take no time")
    simulate_cmd.add_argument("--trace", metavar="FILE",
                              help="write the predicted schedule as a Chrome/Perfetto trace (one track per stage)")

    cross_site_cmd = commands.add_parser("cross-site", help="a pipeline across sites: 1F1B, JEEVES and one site, "
                                                            "simulated (JEEVES, HotNets '25)")
    cross_site_cmd.add_argument("--scenario", required=True, help="the scenario file (configs/xdc/*.yaml)")
    cross_site_cmd.add_argument("--latency-ms", type=float, help="the cross-site link's one-way latency")
    cross_site_cmd.add_argument("--bandwidth-gbps", type=float, help="the cross-site link's bandwidth in GB/s")
    cross_site_cmd.add_argument("--limit", type=int, metavar="K",
                                help="activation memory for K micro-batches of a uniform stage (default: the chip's budget)")
    cross_site_cmd.add_argument("--json", action="store_true")
    partition_cmd = commands.add_parser("partition", help="Zorse's phase 1: the cluster's machines cut into k "
                                                         "groups for every k (min-k-cut of the bandwidth graph)")
    partition_cmd.add_argument("--cluster", required=True, help="cluster YAML")
    partition_cmd.add_argument("--json", action="store_true", help="print one JSON object")

    profile_cmd = commands.add_parser("profile", help="profile the cluster's chip types (measured by running TP ranks "
                                                     "of each, or synthesised)")
    problem(profile_cmd)
    profile_cmd.add_argument("--chip", help="only this chip type (default: every chip type of the cluster)")
    profile_cmd.add_argument("--device", default="cpu",
                             help="torch device of chips without emulation (cpu, dipu, ...); an emulated chip runs "
                                  "on its emulated dipu device")
    profile_cmd.add_argument("--synthesise", action="store_true", help="derive from the spec sheet instead of measuring")
    profile_cmd.add_argument("--repeats", type=int, default=5, help="timed rounds per measurement (median)")
    profile_cmd.add_argument("--out-dir", metavar="DIR", help="profile folder (default profiles/<cluster name>)")
    profile_cmd.add_argument("--out", metavar="FILE", help="with --chip: write this file instead of DIR/<chip>.yaml")
    profile_cmd.add_argument("--force", action="store_true", help="measure again even where a profile is up to date")
    profile_cmd.add_argument("--max-late", type=float, default=0.1, metavar="FRACTION",
                             help="measure a TP size again when more than this fraction of its emulated kernel time "
                                  "was late (the host's load, not the chip); default 0.1")
    profile_cmd.add_argument("--attempts", type=int, default=2,
                             help="measurements of one TP size at most; the least late is kept (default 2)")
    return parser


# ---- loading the problem -------------------------------------------------------------------------
def _problem(args, default_model: ModelConfig | None = None,
             default_seq_len: int | None = None) -> tuple[ClusterSpec, ModelConfig, TrainingSpec]:
    """Cluster, model (--model, else `default_model`, else the cluster file's) and training spec (the
    cluster file's `training` with the flags applied)."""
    cluster = load_cluster(args.cluster)
    if args.model is not None:
        model = resolve_model(args.model)
    elif default_model is not None:
        model = default_model
    elif cluster.model is not None:   # a model file named in the cluster file is relative to it, as chip files are
        relative = cluster.model.endswith((".yaml", ".yml")) and not os.path.isabs(cluster.model)
        model = resolve_model(os.path.join(os.path.dirname(cluster.source), cluster.model) if relative else cluster.model)
    else:
        raise UserError(f"{args.cluster}: no field 'model' and no --model given")
    base = dataclasses.asdict(cluster.training) if cluster.training else {"seq_len": model.max_seq_len}
    if args.seq_len is not None or default_seq_len is not None:
        base["seq_len"] = args.seq_len if args.seq_len is not None else default_seq_len
    if args.gbs_tokens is not None:
        base.update(global_batch_tokens=parse_count(args.gbs_tokens, "--gbs-tokens"), global_batch_sequences=None)
    if args.gbs_sequences is not None:
        base.update(global_batch_sequences=parse_count(args.gbs_sequences, "--gbs-sequences"), global_batch_tokens=None)
    if args.micro_batch_size is not None:
        base["micro_batch_size"] = args.micro_batch_size
    if args.alpha is not None:
        base["alpha"] = args.alpha
    if args.no_zero1:
        base["zero1"] = False
    if base.get("global_batch_tokens") is None and base.get("global_batch_sequences") is None:
        raise UserError(f"{args.cluster}: no global batch: add `training: {{global_batch_tokens: ...}}` or pass --gbs-tokens")
    training = TrainingSpec(**base)
    training.validate("training (cluster file and flags)")
    if training.seq_len > model.max_seq_len:
        raise UserError(f"training: seq_len {training.seq_len} exceeds model '{model.name}' max_seq_len {model.max_seq_len}")
    return cluster, model, training


# ---- search --------------------------------------------------------------------------------------
MAX_TOP = 1000
MAX_GROUP_SIZE = 1 << 24


def _search_options(args) -> dict:
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
    return {"method": method, "top_k": args.top, "group_size": args.group_size or None, "dp": args.dp,
            "monotone_tp": args.monotone_tp, "time_limit_s": args.time_limit, "gap": args.gap,
            "refine_all_dp": args.refine_all_dp}


def _run_search(cluster, model, training, profiles, cost_model: str, options: dict, progress=None):
    if options["method"] == "paper":
        return paper_search.search(cluster, model, training, profiles, top_k=options["top_k"],
                                   group_size=options["group_size"], refine_all_dp=options["refine_all_dp"],
                                   dp=options["dp"])
    return search(cluster, model, training, profiles, cost_model=cost_model, top_k=options["top_k"],
                  group_size=options["group_size"], dp=options["dp"], monotone_tp=options["monotone_tp"],
                  gap=options["gap"], time_limit_s=options["time_limit_s"], progress=progress)


def _show_progress(progress: Progress) -> None:
    gap = progress.best_s / progress.lower_bound_s - 1 if 0 < progress.lower_bound_s < math.inf else math.inf
    line = (f"heteroauto: searching {progress.elapsed_s:6.1f} s, dp/grouping {progress.items_done}/{progress.items}, "
            f"{progress.orders_done} stage orders solved, best {progress.best_s:.4g} s, gap <= "
            + (f"{gap * 100:.2f}%" if math.isfinite(gap) else "?"))
    if sys.stderr.isatty():
        print("\r" + line, end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def _baseline_ratio(cluster, model, training, profiles, result_tokens_per_s, cost_model, options,
                    baseline_tokens=None):
    """HeteroSpeedupRatio = N * TGS / sum_i N_i * TGS_i; type i alone gets its chip share of the batch,
    or baseline_tokens (the paper's Table 6 runs: 2M tokens on each type's 256 chips)."""
    baselines, total = {}, 0.0
    alone_options = {**options, "top_k": 1, "dp": None}
    for chip in cluster.chips:
        if baseline_tokens is not None:
            share = baseline_tokens // training.seq_len
        else:
            share = training.micro_batch_units * chip.count // cluster.total_chips * training.micro_batch_size
        if share < training.micro_batch_size or share % training.micro_batch_size:
            baselines[chip.name] = {"error": f"baseline batch of {share} sequences is not a whole number of micro-batches"}
            return None, baselines
        alone = dataclasses.replace(training, global_batch_tokens=None, global_batch_sequences=share)
        try:
            result = _run_search(cluster.only(chip.name), model, alone, profiles, cost_model, alone_options)
        except UserError as error:
            baselines[chip.name] = {"error": str(error)}
            return None, baselines
        strategy = result.best.to_strategy(model, alone)
        iteration = evaluate_strategy(strategy, cluster, model, alone, profiles, cost_model=cost_model).iteration_s
        tgs = alone.tokens / iteration / chip.count
        baselines[chip.name] = {"chips": chip.count, "gbs_tokens": alone.tokens, "iteration_s": iteration,
                                "tokens_per_chip_s": tgs, "dp": result.best.dp, "tp": list(result.best.tps),
                                "pp": sum(result.best.pps), "recompute": list(result.best.recompute)}
        total += chip.count * tgs
    return result_tokens_per_s / total, baselines


def _profile_paths(args, cluster: ClusterSpec) -> list[str]:
    """--profile files, then the files of the --profiles folder that name one of the cluster's chip types."""
    paths = list(args.profile)
    if args.profiles is not None:
        if not os.path.isdir(args.profiles):
            raise UserError(f"--profiles {args.profiles}: no such folder (heteroauto profile --cluster {args.cluster} "
                            f"writes one)")
        named = {os.path.abspath(path) for path in paths}
        for chip in cluster.chips:
            path = os.path.join(args.profiles, f"{chip.name}.yaml")
            if os.path.exists(path) and os.path.abspath(path) not in named:
                paths.append(path)
    return paths


def _profiles(args, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec):
    """The chip types' profiles: --profile files and the --profiles folder, synthesised for the rest."""
    return profiles_for(cluster, model, training, _profile_paths(args, cluster))


def _emulated(cluster, name: str) -> str:
    return " (emulated)" if cluster.chip(name).emulated else ""


def _cmd_search(args) -> int:
    if args.out:
        _check_output_file(args.out, "--out")
    if args.planner == "zorse":
        return _cmd_search_zorse(args)
    if (args.memory_fraction != 1.0 or args.ministages is not None or args.offload != "auto"
            or args.max_groups is not None or args.min_groups != 1 or args.lone_group_ministages
            or args.no_overlap or args.grad_clip != 1.0):
        raise UserError("--memory-fraction, --ministages, --offload, --max-groups, --min-groups, "
                        "--lone-group-ministages, --no-overlap and --grad-clip: only with --planner zorse")
    cluster, model, training = _problem(args)
    profiles = _profiles(args, cluster, model, training)
    options = _search_options(args)
    schedule = "1f1b-split-backward" if training.alpha == 0 else "1f1b"
    progress = _show_progress if (args.progress or sys.stderr.isatty()) else None
    if args.exhaustive:
        oracle = oracle_search(cluster, model, training, profiles, cost_model=args.cost_model,
                               group_size=options["group_size"], dp=args.dp, monotone_tp=args.monotone_tp)
        strategy, result = dataclasses.replace(oracle.strategy, schedule=schedule), None
        search_s, search_cpu_s, evaluated, bounded = oracle.search_s, oracle.search_cpu_s, oracle.evaluated, 0
    else:
        result = _run_search(cluster, model, training, profiles, args.cost_model, options, progress)
        if progress is not None and sys.stderr.isatty():
            print(file=sys.stderr)
        strategy = result.best.to_strategy(model, training, schedule)
        search_s, search_cpu_s, evaluated, bounded = (result.search_s, result.search_cpu_s, result.evaluated,
                                                      result.bounded)
    report = evaluate_strategy(strategy, cluster, model, training, profiles, cost_model=args.cost_model)
    ratio, baselines = (None, {})
    if not args.no_baselines:
        baseline_tokens = (parse_count(args.baseline_gbs_tokens, "--baseline-gbs-tokens")
                           if args.baseline_gbs_tokens is not None else None)
        ratio, baselines = _baseline_ratio(cluster, model, training, profiles,
                                           report.tokens_per_iteration / report.iteration_s, args.cost_model,
                                           options, baseline_tokens)
    if args.out:
        strategy.save(args.out)
    method = "exhaustive" if args.exhaustive else options["method"]
    optimal = args.exhaustive or (result is not None and result.optimal)
    gap = 0.0 if args.exhaustive else (result.gap if method == "exact" else None)
    rows = [{"chip": s.chip, "emulated": cluster.chip(s.chip).emulated, "tp": s.tp, "dp": s.dp, "layers": s.layers,
             "recompute": s.recompute, "memory_gb": s.memory_bytes / GB, "capacity_gb": s.capacity_bytes / GB,
             "compute_s": s.compute_s, "update_s": s.update_s, "send_s": s.terms.send_s} for s in report.stages]
    payload = {
        "strategy": {"dp": strategy.dp, "micro_batches": strategy.micro_batches,
                     "micro_batch_size": strategy.micro_batch_size, "seq_len": strategy.seq_len,
                     "schedule": strategy.schedule, "model": model.name, "stages": rows},
        "iteration_s": report.iteration_s, "tokens_per_chip_s": report.tokens_per_chip_s,
        "hetero_speedup_ratio": ratio, "baselines": baselines, "cost_model": args.cost_model, "search": method,
        "optimal": optimal, "gap": gap, "timed_out": bool(result is not None and result.timed_out), "lower_bound_s": None if result is None or method != "exact" else result.lower_bound_s,
        "search_s": search_s, "search_cpu_s": search_cpu_s, "evaluated": evaluated, "bounded": bounded,
        "exhaustive": args.exhaustive, "gbs_tokens": training.tokens, "alpha": training.alpha,
        "top": [] if result is None else [
            {"iteration_s": c.objective_s, "dp": c.dp, "order": list(c.order), "groups": [g.label for g in c.groups],
             "tp": list(c.tps), "pp": list(c.pps), "recompute": list(c.recompute),
             "stage_layers": [list(x) for x in c.stage_layers]} for c in result.top],
    }
    if args.json:
        print(json.dumps(payload))
        return 0
    print(f"cluster {cluster.name}: {cluster.total_chips} chips ("
          + ", ".join(f"{c.name}={c.count}{' emulated' if c.emulated else ''}" for c in cluster.chips)
          + f"), model {model.name}, global batch {training.tokens} tokens ({training.sequences} x {training.seq_len}), "
          f"alpha {training.alpha:g}, cost model {args.cost_model}")
    print(f"strategy: dp={strategy.dp} micro_batches={strategy.micro_batches} micro_batch_size={strategy.micro_batch_size} "
          f"pp={len(strategy.stages)} schedule={strategy.schedule}")
    print(f"{'stage':>5} {'chip':>6} {'tp':>3} {'dp':>4} {'layers':>6} {'recomp':>6} {'memory GB':>10} {'cap GB':>7} "
          f"{'T_comp s':>9} {'T_upd s':>8} {'send s':>8}")
    for s in report.stages:
        print(f"{s.index:>5} {s.chip:>6} {s.tp:>3} {s.dp:>4} {s.layers:>6} {'on' if s.recompute else 'off':>6} "
              f"{s.memory_bytes / GB:>10.4g} {s.capacity_bytes / GB:>7.4g} {s.compute_s:>9.4f} {s.update_s:>8.4f} "
              f"{s.terms.send_s:>8.4f}{_emulated(cluster, s.chip)}")
    print(f"predicted iteration: {report.iteration_s:.3f} s   tokens/chip/s: {report.tokens_per_chip_s:.2f}")
    if ratio is not None:
        alone = ", ".join(f"{name} {b['tokens_per_chip_s']:.2f}" for name, b in baselines.items())
        batch = (f"{args.baseline_gbs_tokens} tokens each" if args.baseline_gbs_tokens is not None
                 else "its chip share of the batch")
        print(f"HeteroSpeedupRatio: {ratio * 100:.2f}%  (each type alone, same search, {batch}: "
              f"tokens/chip/s {alone})")
    elif baselines:
        print("HeteroSpeedupRatio: n/a (" + "; ".join(f"{k}: {v.get('error')}" for k, v in baselines.items() if 'error' in v) + ")")
    for rank, c in enumerate(result.top[1:] if result else [], start=2):
        print(f"#{rank}: {c.objective_s:.3f} s dp={c.dp} order={'>'.join(c.order)} tp={list(c.tps)} "
              f"recompute={[int(r) for r in c.recompute]} stage layers={[list(x) for x in c.stage_layers]}")
    if method == "exact":
        proof = "proved optimal" if optimal else (
            f"{'time limit reached; ' if result.timed_out else ''}within {gap * 100:.2f}% of the optimum "
            f"(proved lower bound {result.lower_bound_s:.4g} s)")
    else:
        proof = "exhaustive" if method == "exhaustive" else "the paper's procedure: no optimality bound"
    print(f"search ({method}): {search_s:.3f} s ({search_cpu_s:.3f} s CPU), {evaluated} evaluated, "
          f"{bounded} skipped by bounds; {proof}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


# ---- zorse ---------------------------------------------------------------------------------------
def _zorse_problem(args):
    """Cluster, model, training (one sequence per profiled micro-batch) and the chip rates."""
    cluster, model, training = _problem(args)
    training = dataclasses.replace(training, micro_batch_size=1)
    if not (math.isfinite(args.memory_fraction) and 0 < args.memory_fraction <= 1):
        raise UserError(f"--memory-fraction: must be in (0, 1], got {args.memory_fraction}")
    rates = rates_from_profiles(cluster, _profiles(args, cluster, model, training), args.memory_fraction)
    return cluster, model, training, rates


def _plan_payload(plan: ZorsePlan, cluster: ClusterSpec, simulated_s: float) -> dict:
    return {"planner": "zorse", "iteration_s": plan.latency.iteration_s, "simulated_iteration_s": simulated_s,
            "startup_s": plan.latency.startup_s, "steady_s": plan.latency.steady_s, "drain_s": plan.latency.drain_s,
            "bottleneck": plan.latency.bottleneck, "micro_batch_sequences": plan.micro_batch_sequences,
            "micro_batches": plan.micro_batches, "ministages": plan.ministages, "offload": plan.offload,
            "recompute": plan.recompute, "overlap": plan.overlap, "max_memory_fraction": plan.max_memory_fraction,
            "groups": [{"machines": [m.name for m in g.machines], "regions": sorted(g.regions), "chips": list(g.chips),
                        "emulated": [cluster.chip(c).emulated for c in g.chips], "rows": list(g.rows),
                        "ministage_layers": list(g.ministage_layers),
                        "memory_gb": [m.device_bytes / GB for m in g.memory],
                        "host_gb": [m.host_bytes / GB for m in g.memory],
                        "capacity_gb": [m.capacity_bytes / GB for m in g.memory]} for g in plan.groups]}


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


def _cmd_search_zorse(args) -> int:
    if args.exhaustive or args.search is not None or args.dp is not None:
        raise UserError("--exhaustive, --search and --dp: only with --planner heteroauto")
    if args.ministages is not None and args.ministages < 1:
        raise UserError(f"--ministages: must be at least 1, got {args.ministages}")
    _check_grad_clip(args)
    cluster, model, training, rates = _zorse_problem(args)
    started = time.perf_counter()
    if args.max_groups is not None and args.max_groups < 1:
        raise UserError(f"--max-groups: must be at least 1, got {args.max_groups}")
    if args.min_groups < 1 or (args.max_groups is not None and args.min_groups > args.max_groups):
        raise UserError(f"--min-groups: must be at least 1 and at most --max-groups, got {args.min_groups}")
    found = zorse_plan(cluster, model, training, rates, ministages=args.ministages, offload=args.offload,
                       overlap=not args.no_overlap, max_groups=args.max_groups, min_groups=args.min_groups,
                       lone_group_ministages=args.lone_group_ministages, grad_clip=args.grad_clip)
    searched_s = time.perf_counter() - started
    simulated = simulate_plan(found.best, rates, model, training).iteration_s
    strategy = to_strategy(found.best, model)
    if args.out:
        strategy.save(args.out)
    if args.json:
        print(json.dumps({**_plan_payload(found.best, cluster, simulated), "search_s": searched_s,
                          "evaluated": found.evaluated, "strategy": strategy.to_dict()}))
        return 0
    print(f"cluster {cluster.name}: {cluster.total_chips} chips on {len(machines_of(cluster))} machines, model "
          f"{model.name}, global batch {training.tokens} tokens ({training.sequences} x {training.seq_len})")
    _print_plan(found.best, cluster, simulated)
    print(f"search (zorse): {searched_s:.3f} s, {found.evaluated} candidates evaluated over "
          f"{len(found.partitions)} partitions")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def _cmd_partition(args) -> int:
    cluster = load_cluster(args.cluster)
    machines = machines_of(cluster)
    partitions = split_partitions(bandwidth_graph(cluster, machines), f"{args.cluster}: bandwidth graph")

    def describe(group) -> dict:
        chips: dict[str, int] = {}
        for index in group:
            for chip in machines[index].chips:
                chips[chip] = chips.get(chip, 0) + 1
        return {"machines": [machines[i].name for i in group], "regions": sorted({machines[i].region for i in group}),
                "chips": chips}

    rows = [{"k": p.k, "cut_gbps": p.cut_weight, "groups": [describe(g) for g in p.groups]} for p in partitions]
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
def _cmd_simulate_zorse(args, strategy) -> int:
    cluster, model, training = _problem(args, default_model=strategy.model_config(args.strategy),
                                        default_seq_len=strategy.seq_len)
    training = dataclasses.replace(training_for(strategy, training), micro_batch_size=1)
    rates = rates_from_profiles(cluster, _profiles(args, cluster, model, training), 1.0)
    _check_grad_clip(args)
    scored = from_strategy(strategy, cluster, model, training, rates, args.strategy, overlap=not args.no_overlap,
                           grad_clip=args.grad_clip)
    replay = simulate_plan(scored, rates, model, training, keep_timeline=args.trace is not None)
    simulated = replay.iteration_s
    if args.trace is not None:
        from h2.core.trace import write_trace
        from heteroauto.simulator import trace_events

        labels = [f"{len(group.chips)} ranks ({', '.join(sorted(set(group.chips)))}), {group.layers} layers in "
                  f"{scored.ministages} ministages" for group in scored.groups]
        write_trace(args.trace, trace_events(replay, labels, False), {"source": "predicted"})
    if args.json:
        print(json.dumps({**_plan_payload(scored, cluster, simulated), "iteration_s": simulated,
                          "latency_model_iteration_s": scored.latency.iteration_s,
                          "fits": scored.max_memory_fraction <= 1}))
        return 0
    print(f"strategy {args.strategy}: Zorse groups priced by the Zorse latency and memory models, replayed by the "
          f"simulator")
    _print_plan(scored, cluster, simulated)
    return 0


def _cmd_simulate(args) -> int:
    strategy = load_strategy(args.strategy)
    if is_zorse_strategy(strategy):
        return _cmd_simulate_zorse(args, strategy)
    if args.grad_clip != 1.0:
        raise UserError(f"--grad-clip: only for a Zorse strategy (ministages, ZeRO-2, offload or mixed-type "
                        f"groups); {args.strategy} is none")
    cluster, model, training = _problem(args, default_model=strategy.model_config(args.strategy),
                                        default_seq_len=strategy.seq_len)
    training = training_for(strategy, training)
    if args.alpha is None:
        training = dataclasses.replace(training, alpha=0.0 if strategy.schedule == "1f1b-split-backward" else 1.0)
    if strategy.micro_batches > MAX_REPLAY_MICRO_BATCHES:
        raise UserError(f"{args.strategy}: field 'micro_batches': the replay takes at most "
                        f"{MAX_REPLAY_MICRO_BATCHES} micro-batches, got {strategy.micro_batches}")
    profiles = _profiles(args, cluster, model, training)
    report = evaluate_strategy(strategy, cluster, model, training, profiles, source=args.strategy,
                               cost_model=args.cost_model)
    terms = report.terms
    if args.cost_model == "full":   # boundaries between sites at their inter-site links
        terms, _ = site_terms(strategy, cluster, terms, model, training, args.strategy)
    strategy, generated = with_schedule_orders(strategy, cluster, None, args.strategy, profiles)
    if generated and not args.json:
        print(generated)
    schedule = run_schedule(strategy, None, args.strategy)   # its explicit orders where it has them
    started = time.perf_counter()
    sim = simulate(schedule, terms, transfers=not args.no_transfers, keep_timeline=args.trace is not None)
    sim_s = time.perf_counter() - started
    if args.trace is not None:
        write_simulated_trace(args.trace, sim, report, strategy.schedule)
    tokens = training.tokens
    payload = {"iteration_s": sim.iteration_s, "cost_model_iteration_s": report.iteration_s,
               "cost_model": args.cost_model,
               "tokens_per_chip_s": tokens / sim.iteration_s / report.chips, "schedule": strategy.schedule,
               "micro_batches": strategy.micro_batches, "transfers": sim.transfers, "simulate_s": sim_s,
               "fits": report.fits,
               "stages": [{"chip": s.chip, "emulated": cluster.chip(s.chip).emulated, "tp": s.tp, "dp": s.dp,
                           "layers": s.layers, "recompute": s.recompute, "busy_s": busy, "bubble_s": bubble,
                           "update_s": s.update_s, "send_s": term.send_s,
                           "memory_gb": s.memory_bytes / GB, "capacity_gb": s.capacity_bytes / GB}
                          for s, term, busy, bubble in zip(report.stages, terms, sim.busy_s, sim.bubble_s)]}
    if args.json:
        print(json.dumps(payload))
        return 0
    print(f"strategy {args.strategy}: {len(strategy.stages)} stages, dp={strategy.dp}, "
          f"{strategy.micro_batches} micro-batches, schedule {strategy.schedule}, cost model {args.cost_model}")
    print(f"{'stage':>5} {'chip':>6} {'tp':>3} {'dp':>3} {'layers':>6} {'busy s':>10} {'bubble s':>10} "
          f"{'update s':>9} {'send s':>8} {'memory GB':>10} {'cap GB':>7}")
    for s, term, busy, bubble in zip(report.stages, terms, sim.busy_s, sim.bubble_s):
        flag = "" if s.fits else "  OVER CAPACITY"
        print(f"{s.index:>5} {s.chip:>6} {s.tp:>3} {s.dp:>3} {s.layers:>6} {busy:>10.4f} {bubble:>10.4f} {s.update_s:>9.4f} "
              f"{term.send_s:>8.4f} {s.memory_bytes / GB:>10.4g} {s.capacity_bytes / GB:>7.4g}{flag}"
              f"{_emulated(cluster, s.chip)}")
    print(f"simulated iteration: {sim.iteration_s:.4f} s ({'no transfers' if args.no_transfers else f'{sim.transfers} transfers'}); "
          f"cost model: {report.iteration_s:.4f} s; tokens/chip/s: {payload['tokens_per_chip_s']:.2f}")
    return 0


def write_simulated_trace(path: str, sim, report, schedule: str) -> None:
    from h2.core.trace import write_trace
    from heteroauto.simulator import trace_events

    labels = [f"{s.chip} tp {s.tp} dp {s.dp}, {s.layers} layers" for s in report.stages]
    write_trace(path, trace_events(sim, labels, schedule == "1f1b-split-backward"), {"source": "predicted"})


def _check_output_file(path: str, flag: str) -> None:
    """Refuse, before any work, an output file whose folder cannot be created or written."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise UserError(f"{flag} {path}: cannot create folder '{folder}' ({error.strerror or error})") from None
    if not os.access(folder, os.W_OK):
        raise UserError(f"{flag} {path}: folder '{folder}' is not writable")


# ---- profile ------------------------------------------------------------------------------------
def _profile_targets(args, cluster: ClusterSpec) -> list[tuple[ChipType, str]]:
    """(chip type, profile file) for each chip type to profile."""
    if args.out is not None and args.chip is None:
        raise UserError("--out names one profile file: give --chip too (or --out-dir for every chip type)")
    folder = args.out_dir or os.path.join("profiles", cluster.name)
    chips = [cluster.chip(args.chip)] if args.chip is not None else list(cluster.chips)
    targets = [(chip, args.out if args.out is not None else os.path.join(folder, f"{chip.name}.yaml"))
               for chip in chips]
    for _, path in targets:
        _check_output_file(path, "--out" if args.out is not None else "--out-dir")
    return targets


def _cached(path: str, cluster: ClusterSpec, chip: ChipType, model: ModelConfig, training: TrainingSpec):
    """The profile at `path` if it was measured for exactly this chip entry, model and shape."""
    if not os.path.exists(path):
        return None
    try:
        profile = load_profile(path)
    except UserError:
        return None
    return profile if profile.fingerprint == profile_fingerprint(cluster, chip, model, training) else None


def _measure(cluster: ClusterSpec, chips: list[tuple[ChipType, str]], model: ModelConfig, training: TrainingSpec,
             args) -> dict:
    """Measure every (chip, TP size) on TP ranks, with one progress bar over them all. A measurement
    whose emulated kernels ran late by more than --max-late of their time (the host could not keep up)
    is taken again, up to --attempts times, and the least late one kept."""
    from h2.train.progress import ProgressBar
    from heteropp.profiling import measure_tp  # imports torch

    dtype = "bfloat16" if training.activation_bytes_per_element == 2 else "float32"
    jobs = [(chip, path, tp) for chip, path in chips for tp in chip.tp_sizes()]
    bar = ProgressBar(len(jobs))
    bar.update(0, chip=jobs[0][0].name if jobs else "-")
    measured: dict[str, list[dict]] = {}
    for done, (chip, path, tp) in enumerate(jobs, start=1):
        directory = os.path.join(os.path.dirname(os.path.abspath(path)), "emulated-chips")
        attempts = []
        while len(attempts) < args.attempts and (not attempts or attempts[-1].late_fraction > args.max_late):
            attempts.append(measure_tp(chip, model, tp, micro_batch_size=training.micro_batch_size,
                                       seq_len=training.seq_len, dtype=dtype, device=args.device,
                                       repeats=args.repeats, directory=directory, cluster=cluster))
        measurement = min(attempts, key=lambda attempt: attempt.late_fraction)
        measured.setdefault(chip.name, []).append(dataclasses.asdict(measurement))
        bar.update(done, chip=f"{chip.name} tp {tp}")
    return measured


def _print_profile(profile, chip: ChipType, path: str, how: str) -> None:
    where = describe_chip(chip) + (f", device {profile.device}" if profile.device else "")
    state = f"up to date in {path}" if how == "cached" else f"wrote {path}"
    print(f"profile of chip {where}: {profile.source}, {state}")
    for line in profile.assumptions[-1:] if profile.source == "measured" else ():
        print(f"  {line}")
    formula = {entry.tp: entry for entry in profile.formula_layers}
    header = f"{'tp':>3} {'fwd ms':>9} {'bwd ms':>9} {'recomp ms':>9} {'act MB':>8} {'act MB rc':>9}"
    print(header + (f" | {'formula from tp 1: fwd ms':>25} {'bwd ms':>9} {'measured/formula':>16}" if formula else ""))
    for entry in profile.layers:
        line = (f"{entry.tp:>3} {entry.forward_s * 1e3:>9.2f} {entry.backward_s * 1e3:>9.2f} "
                f"{entry.recompute_s * 1e3:>9.2f} {entry.activation_bytes / 1e6:>8.3f} "
                f"{entry.recompute_activation_bytes / 1e6:>9.3f}")
        if entry.tp in formula:
            derived = formula[entry.tp]
            ratio = entry.compute_s(False) / derived.compute_s(False)
            line += f" | {derived.forward_s * 1e3:>25.2f} {derived.backward_s * 1e3:>9.2f} {ratio:>16.2f}"
        print(line)


def _cmd_profile(args) -> int:
    cluster, model, training = _problem(args)
    if args.repeats < 1:
        raise UserError("--repeats: must be at least 1")
    if args.attempts < 1:
        raise UserError("--attempts: must be at least 1")
    if not 0 <= args.max_late:
        raise UserError(f"--max-late: must be a fraction >= 0, got {args.max_late}")
    targets = _profile_targets(args, cluster)
    if args.synthesise:
        profiles = {chip.name: synthesise_profile(chip, model, training) for chip, _ in targets}
        how = {chip.name: "synthesised" for chip, _ in targets}
    else:
        for chip, _ in targets:  # one measurement runs tp_max ranks of the chip at once
            check_core_share([chip] * chip.tp_max, host_cores(), cluster.source,
                             f"profiling ranks of chip '{chip.name}' at tp {chip.tp_max}")
        profiles = {} if args.force else {chip.name: _cached(path, cluster, chip, model, training)
                                             for chip, path in targets}
        profiles = {name: profile for name, profile in profiles.items() if profile is not None}
        how = {name: "cached" for name in profiles}
        missing = [(chip, path) for chip, path in targets if chip.name not in profiles]
        if any(chip.emulation is None for chip, _ in missing):
            resolve_device(args.device)  # the measuring ranks would each fail on a device this host lacks
        for name, measurements in _measure(cluster, missing, model, training, args).items() if missing else ():
            chip = cluster.chip(name)
            profiles[name] = measured_profile(cluster, chip, model, training, measurements, device=args.device,
                                              repeats=args.repeats)
            how[name] = "measured"
    for chip, path in targets:
        if how[chip.name] != "cached":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            save_profile(profiles[chip.name], path)
    if args.json:
        print(json.dumps({chip.name: profiles[chip.name].to_dict() for chip, _ in targets}))
        return 0
    for chip, path in targets:
        _print_profile(profiles[chip.name], chip, path, how[chip.name])
    return 0


# ---- cross-site ----------------------------------------------------------------------------------
def _cmd_cross_site(args) -> int:
    from heteroauto.cross_site import compare, load_scenario
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
    scenario = scenario.with_link(latency_ms=args.latency_ms, bandwidth_gbps=args.bandwidth_gbps)
    started = time.perf_counter()
    report = compare(scenario)
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps({**report.to_dict(), "simulate_s": elapsed}))
        return 0
    p = scenario.pipeline
    print(f"{scenario.source}: {p.replicas} replicas x {p.stages} stages x TP{p.tensor_parallel}, {p.micro_batches} "
          f"micro-batches each, {scenario.chip.name}; cross-site link {report.bandwidth_gbps:g} GB/s, "
          f"{report.latency_ms:g} ms (simulated)")
    for run in (report.one_f_one_b, report.uncoordinated, report.jeeves, report.one_site):
        fits = "" if run.fits else "  (does not fit the activation budget)"
        print(f"  {run.name:32s} {run.iteration_s:8.3f} s   layers {list(run.layers)}  peak in flight "
              f"{run.peak_in_flight}{fits}")
    bounds = report.jeeves.bounds
    print(f"  critical-path bound (jeeves' division): compute {bounds.compute_s:.3f} s, communication "
          f"{bounds.communication_s:.3f} s")
    print(f"  jeeves saves {1 - 1 / report.speedup:.1%} against 1f1b; {report.jeeves.iteration_s / report.one_site.iteration_s:.3f}x "
          f"the one-site time; simulated in {elapsed:.1f} s")
    return 0


# ---- for the product's commands (h2 run, h2 profile, h2 plan) --------------------------------------
def run_profile(argv: list[str]) -> int:
    """`heteroauto profile ARGV...` run from another command, in this process."""
    return _cmd_profile(_parser().parse_args(["profile", *argv]))


@dataclasses.dataclass
class PlanningProblem:
    """What `heteroauto search ARGV...` plans: the cluster, model and training, and the chip profiles."""
    args: argparse.Namespace
    cluster: ClusterSpec
    model: ModelConfig
    training: TrainingSpec

    def profiles(self, training: TrainingSpec | None = None):
        """The chip profiles (from --profiles, or synthesised) for `training` (default: the problem's)."""
        return _profiles(self.args, self.cluster, self.model, training or self.training)


def planning_problem(argv: list[str]) -> PlanningProblem:
    args = _parser().parse_args(["search", *argv])
    return PlanningProblem(args, *_problem(args))


@run_cli("heteroauto")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return {"search": _cmd_search, "simulate": _cmd_simulate, "profile": _cmd_profile,
            "cross-site": _cmd_cross_site, "partition": _cmd_partition}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
