"""`h2 run`: from a cluster file to a trained, checked model in one command; and each of its steps as
a command of its own.

    h2 run     --cluster C [--model M] --out DIR [--steps N ...] [--reference RUN] [--profiles P]
               [--overwrite | --resume]
    h2 profile --cluster C [--model M] [--profiles P] [--force]
    h2 plan    --cluster C [--model M] [--profiles P] --out DIR [--overwrite]
    h2 check   --run DIR [--reference RUN] [--threshold T]

`h2 run` is `h2 profile` (HeteroAuto's profiler, `heteroauto profile`: the chip types without an up-to-date
profile are measured, the rest read from the cache, one folder per cluster and model), `h2 plan`
(HeteroAuto's search and simulator: DIR/strategy.yaml and DIR/plan.json, the plan printed with its
predicted step time and memory), `h2 train --strategy DIR/strategy.yaml --cluster C --out DIR` (torchrun
ranks, each as its stage's chip; a progress line per step), and `h2 check` (measured against predicted
step time and memory; with --reference the precision diff of the loss curve, ditorch.precision: MRE,
pass or fail, DIR/precision-diff.png). Exit 0, or 1 when the precision diff fails, 2 on bad input.

`h2 run --resume` continues the run in DIR from its latest checkpoint with DIR/strategy.yaml as it is
(no profiling, no planning); a folder planned for another model or cluster is refused.

Every input is checked before anything is written: a missing cluster file, a reference run of another
model, or an output folder holding an earlier run (without --overwrite or --resume) is one line and exit
status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import tempfile

from h2.core import flags
from h2.core.cluster import ClusterSpec, load_cluster
from h2.core.emulation import describe_chip
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.core.run_lock import hold_output_folder
from h2.core.strategy import load_strategy
from h2.core.training import PipelineOptions, RunOptions, TrainConfig
from h2.launch.profiling_job import profile_chips
from heteroauto.planning import PlannedStrategy, plan_strategy, replay_strategy
from heteroauto.predicted_trace import write_strategy_trace
from heteroauto.problem import PlanningProblem, model_for, planning_problem
from heteroauto.profile_cache import model_folder, profile_report, profile_targets

PLAN_FILE, STRATEGY_FILE, SUMMARY_FILE, PLOT_FILE = "plan.json", "strategy.yaml", "summary.json", "precision-diff.png"
METRICS_FILE, STAGE_REPORT_FILE = "metrics.jsonl", "stage_report.json"
# What a folder holds once a run or a plan wrote into it.
RUN_FILES = (PLAN_FILE, STRATEGY_FILE, METRICS_FILE, SUMMARY_FILE)
# The plan fixes the batch shape and HeteroPP trains in fp32 on the cluster's chips: these training
# flags are not h2 run's.
NOT_IN_RUN = ("micro_batch_size", "micro_batches", "seq_len", "dtype", "device")
# Of the run options, h2 run takes these (with the same names as h2 train's); the others it sets itself.
RUN_OPTIONS_IN_RUN = ("resume", "max_restarts")
MB = 1e6


# ---- the problem: cluster, model, folders ----------------------------------------------------------
def _cluster_and_model(args) -> tuple[ClusterSpec, ModelConfig]:
    """The cluster file, loaded once for the whole command, and the model (--model, else the file's)."""
    if not os.path.isfile(args.cluster):
        raise UserError(f"--cluster {args.cluster}: no such file")
    cluster = load_cluster(args.cluster)
    return cluster, model_for(cluster, args.model)


def profile_folder(args, cluster: ClusterSpec, model: ModelConfig) -> str:
    """The profile cache: --profiles, else profiles/<cluster name>/<model name>/ (one file per chip type)."""
    return args.profiles or model_folder(cluster, model)


def _planning_problem(cluster: ClusterSpec, model: ModelConfig, profiles: str) -> PlanningProblem:
    """The cluster file's training for `model`, priced with the profiles in the folder `profiles`."""
    return planning_problem(cluster, model, profile_folder=profiles)


def _check_out(out: str, overwrite: bool) -> None:
    """Refuse an output folder holding an earlier run or plan, unless --overwrite."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out}: exists and is not a folder")
    held = [name for name in RUN_FILES if os.path.exists(os.path.join(out, name))]
    if held and not overwrite:
        raise UserError(f"--out {out}: holds an earlier run ({', '.join(held)}); pass --overwrite to start over "
                        f"or choose another folder")


def cluster_identity(cluster: ClusterSpec) -> dict:
    """What a plan depends on in a cluster file: its name and every chip type's fields."""
    return json.loads(
        json.dumps({"name": cluster.name, "chips": [dataclasses.asdict(chip) for chip in cluster.chips]}, default=str))


def check_resume(out: str, args, cluster: ClusterSpec, model: ModelConfig) -> None:
    """`--resume`: OUT holds a plan (strategy.yaml, plan.json) for this model and this cluster."""
    missing = [name for name in (PLAN_FILE, STRATEGY_FILE) if not os.path.isfile(os.path.join(out, name))]
    if missing:
        raise UserError(f"--resume: --out {out} holds no run to continue (no {' or '.join(missing)}); "
                        f"start one without --resume")
    plan = _read_json(os.path.join(out, PLAN_FILE))
    if plan.get("model_config") != model.to_dict():
        raise UserError(f"--resume: --out {out} is a run of model '{plan.get('model')}', this run trains "
                        f"'{model.name}'; resume with the same model or choose another folder")
    planned = plan.get("cluster_config")
    if planned is None:  # a plan.json from before it recorded the cluster's fields: its file must match
        same = os.path.abspath(str(plan.get("cluster"))) == os.path.abspath(args.cluster)
    else:
        same = planned == cluster_identity(cluster)
    if not same:
        name = (planned or {}).get("name", plan.get("cluster"))
        other = " with other chip types" if name == cluster.name else ""
        raise UserError(f"--resume: --out {out} was planned for cluster '{name}' ({plan.get('cluster')}), "
                        f"--cluster {args.cluster} is '{cluster.name}'{other}; resume with the cluster the run "
                        f"was planned for or choose another folder")


def _model_of_run(path: str) -> dict | None:
    """The model configuration a run folder (or its metrics file) was trained with: its plan.json (h2 run,
    h2 plan) or its latest checkpoint (h2 train); None when the folder does not say."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    plan = os.path.join(folder, PLAN_FILE)
    if os.path.isfile(plan):
        return _read_json(plan).get("model_config")
    from h2.train.checkpoint import CheckpointDir

    checkpoints = CheckpointDir(folder)
    if checkpoints.steps():
        return checkpoints.load_latest().manifest["model_config"]
    return None


def check_reference(reference: str, model: ModelConfig):
    """The reference run's loss log, after checking it was trained with `model`."""
    from ditorch.precision.loss_log import read_loss_log

    if not os.path.exists(reference):
        raise UserError(f"--reference {reference}: no such file or folder")
    log = read_loss_log(reference)
    trained = _model_of_run(reference)
    if trained is not None and trained != model.to_dict():
        raise UserError(f"--reference {reference}: a run of model '{trained.get('name')}', this run trains "
                        f"'{model.name}'; compare runs of the same model")
    return log


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: cannot read ({getattr(error, 'strerror', None) or error})") from None


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)


# ---- profile ----------------------------------------------------------------------------------------
def profile(args, cluster: ClusterSpec, model: ModelConfig) -> str:
    """Measure the chip types without an up-to-date profile in the cache (as heteroauto profile does),
    print each chip type's profile (an INVALID one is kept, marked untrusted in its report: the run's
    `h2 check` verdict covers it); the folder."""
    folder = profile_folder(args, cluster, model)
    training = planning_problem(cluster, model).training
    targets = profile_targets(cluster, folder)
    profiled = profile_chips(cluster, model, training, targets, force=args.force_profile, refuse_untrusted=False)
    for target in targets:
        name = target.chip.name
        print(profile_report(profiled.profiles[name], target, profiled.how[name]))
    return folder


# ---- plan -------------------------------------------------------------------------------------------
def plan_record(plan: PlannedStrategy, cluster_path: str, cluster: ClusterSpec, model: ModelConfig,
                profiles: str) -> dict:
    """PLAN_FILE's content: what the plan was made for (cluster, model, profiles) and what it predicts."""
    strategy, report = plan.strategy, plan.report
    return {
        "cluster": cluster_path, "cluster_config": cluster_identity(cluster), "model": model.name,
        "model_config": model.to_dict(), "profiles": profiles, "strategy": STRATEGY_FILE, "schedule": strategy.schedule,
        "micro_batches": strategy.micro_batches, "dp": strategy.dp, "predicted": {
            "simulator_step_s": plan.simulation.iteration_s, "cost_model_step_s": report.iteration_s, "stages": [{
                "stage": s.index, "chip": s.chip, "tp": s.tp, "dp": s.dp, "layers": s.layers, "recompute": s.recompute,
                "memory_bytes": s.memory_bytes, "capacity_bytes": s.capacity_bytes
            } for s in report.stages]
        }
    }


def make_plan(cluster: ClusterSpec, model: ModelConfig, profiles: str) -> PlannedStrategy:
    """HeteroAuto's search on the cluster with the profiles in `profiles`, scored by the cost model and
    replayed by the simulator (as `heteroauto search` and `heteroauto simulate` do)."""
    return plan_strategy(_planning_problem(cluster, model, profiles))


def replayed_plan(cluster: ClusterSpec, model: ModelConfig, out: str, profiles: str) -> PlannedStrategy:
    """The plan in OUT (its strategy.yaml as it is, not searched again), scored and simulated on the
    profiles in `profiles` (for a resumed run's predicted trace)."""
    path = os.path.join(out, STRATEGY_FILE)
    return replay_strategy(_planning_problem(cluster, model, profiles), load_strategy(path), path)


def print_plan(plan: PlannedStrategy, cluster: ClusterSpec, model: ModelConfig) -> None:
    strategy, report = plan.strategy, plan.report
    chips = {chip.name: chip for chip in cluster.chips}
    print(
        f"plan for model {model.name} on cluster {cluster.name}: {len(strategy.stages)} stages, dp {strategy.dp}, "
        f"{strategy.micro_batches} micro-batches of {strategy.micro_batch_size} x {strategy.seq_len} tokens, "
        f"schedule {strategy.schedule}", flush=True)
    print(f"{'stage':>5}  {'chip':<44} {'tp':>3} {'dp':>3} {'layers':>6} {'recompute':>9} "
          f"{'memory MB':>10} {'of MB':>8}")
    for s in report.stages:
        print(f"{s.index:>5}  {describe_chip(chips[s.chip]):<44} {s.tp:>3} {s.dp:>3} {s.layers:>6} "
              f"{'on' if s.recompute else 'off':>9} {s.memory_bytes / MB:>10.2f} {s.capacity_bytes / MB:>8.2f}")
    print(
        f"predicted step time: {plan.simulation.iteration_s:.3f} s (simulator), {report.iteration_s:.3f} s "
        f"(cost model)", flush=True)


def write_plan(plan: PlannedStrategy, out: str, args, cluster: ClusterSpec, model: ModelConfig, profiles: str) -> None:
    os.makedirs(out, exist_ok=True)
    plan.strategy.save(os.path.join(out, STRATEGY_FILE))
    _write_json(os.path.join(out, PLAN_FILE), plan_record(plan, args.cluster, cluster, model, profiles))


# ---- train ------------------------------------------------------------------------------------------
def train(args, out: str, cluster: ClusterSpec) -> int:
    """`h2 train --strategy OUT/strategy.yaml --cluster C --out OUT` with the training flags given (and
    --resume, --overwrite, --max-restarts), on the cluster file already loaded."""
    from h2.launch.pipeline_job import run_pipeline_job

    run = RunOptions(strategy=os.path.join(out, STRATEGY_FILE), cluster=args.cluster, out=out, resume=bool(args.resume),
                     overwrite=args.overwrite, max_restarts=args.max_restarts)
    # the launcher resolves the job from these values: exactly the options given count as given
    given = {**flags.given(args, TrainConfig), **flags.given(args, PipelineOptions)}
    files = {name: getattr(run, name) for name in ("strategy", "cluster", "out")}
    switches = {
        name: getattr(run, name) for name in ("resume", "overwrite", "max_restarts")
        if getattr(run, name) not in (None, False)
    }
    values = {**given, **files, **switches}
    hosts = (args.nnodes, args.rdzv_endpoint) if args.nnodes > 1 else None
    return run_pipeline_job(values, run, hosts, cluster)


def write_traces(folder: str, plan: PlannedStrategy) -> None:
    """FOLDER/measured.json (every rank's spans, one track per rank) beside FOLDER/predicted.json (the
    simulator's schedule for one step, one track per stage)."""
    import glob

    from h2.core.trace import merge_traces

    ranks = sorted(glob.glob(os.path.join(folder, "rank-*.json")),
                   key=lambda path: int(os.path.basename(path)[len("rank-"):-len(".json")]))
    merge_traces(ranks, os.path.join(folder, "measured.json"))
    write_strategy_trace(os.path.join(folder, "predicted.json"), plan.simulation, plan.report, plan.strategy.schedule)
    print(f"traces: {os.path.join(folder, 'measured.json')} (one track per rank) and "
          f"{os.path.join(folder, 'predicted.json')} (the simulator's step); open them in https://ui.perfetto.dev")


# ---- check ------------------------------------------------------------------------------------------
def measurement_verdict(stage_report: list[dict]) -> dict:
    """Prints whether the run's step times and memory can be trusted (h2.core.emulation's verdict on its
    late kernel time: INVALID past 5 %); the verdict for summary.json."""
    from h2.core.emulation import stage_report_trust

    trust = stage_report_trust(stage_report)
    print(f"measurement {trust.describe()}")
    return {"trusted": trust.trusted, "late_fraction": trust.fraction}


def measured_step_s(records: list[dict]) -> tuple[float, str]:
    """The median step time leaving out the first steps (start-up: allocation, first receives) when
    there are enough; and which steps it covers."""
    skip = min(2, len(records) - 1)
    kept = records[skip:]
    return statistics.median(r["step_time_s"] for r in kept), f"steps {kept[0]['step']}..{kept[-1]['step']}"


def check(out: str, reference=None, threshold: float | None = None) -> int:
    """Measured against predicted (step time, memory per stage), and the precision diff against
    `reference` (a LossLog); writes OUT/summary.json (and OUT/precision-diff.png). 0, or 1 on a failed diff."""
    from ditorch.precision.loss_diff import DEFAULT_THRESHOLD, compare_losses, format_report
    from ditorch.precision.loss_log import read_loss_log
    from h2.train.metrics import read_metrics

    plan = _read_json(os.path.join(out, PLAN_FILE))
    metrics_path = os.path.join(out, METRICS_FILE)
    if not os.path.isfile(metrics_path):
        raise UserError(f"--run {out}: no {METRICS_FILE} (the run did not train)")
    records = read_metrics(metrics_path)
    if not records:
        raise UserError(f"{metrics_path}: no steps recorded")
    predicted = plan["predicted"]
    step_s, which = measured_step_s(records)
    summary = {
        "steps": len(records), "first_loss": records[0]["loss"], "last_loss": records[-1]["loss"],
        "measured_step_s": step_s, "measured_steps": which, **{
            k: predicted[k] for k in ("simulator_step_s", "cost_model_step_s")
        }
    }
    print(f"loss {records[0]['loss']:.4f} at step {records[0]['step']} -> {records[-1]['loss']:.4f} at step "
          f"{records[-1]['step']}")
    print(f"step time: measured {step_s:.3f} s (median of {which}) vs predicted {predicted['simulator_step_s']:.3f} s "
          f"(simulator, measured/predicted {step_s / predicted['simulator_step_s']:.2f}) and "
          f"{predicted['cost_model_step_s']:.3f} s (cost model, {step_s / predicted['cost_model_step_s']:.2f})")
    stage_report = os.path.join(out, STAGE_REPORT_FILE)
    if os.path.isfile(stage_report):
        rows = []
        for model_row, measured in zip(predicted["stages"], _read_json(stage_report)):
            peak = measured["peak_allocated_bytes"]
            rows.append({
                "stage": model_row["stage"], "chip": model_row["chip"], "predicted_bytes": model_row["memory_bytes"],
                "measured_peak_bytes": peak, "vendor": measured.get("vendor")
            })
            shown = f"{peak / MB:.2f} MB" if peak is not None else "not measured on this device"
            late = (f"; {measured['overrun_s'] / measured['emulated_s']:.1%} of its emulated kernel time late "
                    f"(the host's load)" if measured.get("emulated_s") else "")
            vendor = f" on the {measured['vendor']} vendor" if measured.get("vendor") else ""
            print(f"stage {model_row['stage']} ({model_row['chip']}){vendor}: peak memory {shown} vs predicted "
                  f"{model_row['memory_bytes'] / MB:.2f} MB of {model_row['capacity_bytes'] / MB:.2f} MB{late}")
        summary["memory"] = rows
        summary["measurement"] = measurement_verdict(_read_json(stage_report))
    status = 0
    if reference is not None:
        from ditorch.precision.plot import plot_loss_diff

        candidate = read_loss_log(metrics_path)
        diff = compare_losses(reference, candidate, threshold=threshold or DEFAULT_THRESHOLD)
        plot = os.path.join(out, PLOT_FILE)
        plot_loss_diff(diff, plot, reference_label=reference.path, candidate_label=candidate.path)
        print(
            format_report(diff, reference.path, candidate.path).splitlines()[-1] + f" against {reference.path}; "
            f"plot {plot}")
        summary["precision"] = {"reference": reference.path, "plot": plot, **diff.to_dict()}
        status = 0 if diff.passed else 1
    _write_json(os.path.join(out, SUMMARY_FILE), summary)
    return status


# ---- the commands -----------------------------------------------------------------------------------
def _problem_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, metavar="YAML", help="cluster file (chip types, links, training)")
    parser.add_argument("--model", help="model preset or YAML (default: the cluster file's `model`)")
    parser.add_argument("--profiles", metavar="DIR",
                        help="profile cache (default profiles/<cluster name>/<model name>)")
    parser.add_argument("--force-profile", action="store_true", help="measure every chip type again")


def _reference_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reference", metavar="RUN",
        help="a run of the same model (its folder or metrics.jsonl, or a CSV of step,loss): "
        "compare the loss curves (MRE)")
    parser.add_argument("--threshold", type=flags.finite_float,
                        help="pass when MRE < threshold (default 0.015, the H2 paper's)")


def _check_threshold(threshold: float | None) -> None:
    if threshold is not None and not threshold > 0:
        raise UserError(f"--threshold must be a positive number, got {threshold:g}")


def check_writable_folder(folder: str, flag: str) -> None:
    """Refuse, before any work, a folder that cannot be created or written: it, or the nearest folder
    above it that exists, must be a folder this user may write into."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"{flag} {folder}: {existing} is not a folder")
    try:  # a file without a name (O_TMPFILE where the file system has it): nothing is left behind
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as error:
        raise UserError(f"{flag} {folder}: cannot write in {existing} ({error.strerror or error})") from None


def _check_run_flags(args) -> TrainConfig:
    """Every flag of `h2 run`, checked before anything is profiled or written; the training options."""
    from h2.core.dips import parse_address

    if args.nnodes < 1:
        raise UserError(f"--nnodes must be at least 1, got {args.nnodes}")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise UserError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (where the hosts meet)")
    if args.rdzv_endpoint is not None:
        parse_address(args.rdzv_endpoint, "--rdzv-endpoint")
    if args.resume and args.overwrite:
        raise UserError("--resume continues the run in --out, --overwrite starts it over: give one")
    _check_threshold(args.threshold)
    RunOptions(resume=bool(args.resume), max_restarts=args.max_restarts)
    PipelineOptions(**flags.given(args, PipelineOptions))
    check_writable_folder(args.out, "--out")
    return TrainConfig(**flags.given(args, TrainConfig))


def _check_reference_length(reference, config: TrainConfig) -> None:
    """The comparison needs every step of the reference: a reference longer than the run is refused
    before the run trains."""
    last = max(reference.steps)
    if last > config.steps:
        raise UserError(f"--reference {reference.path}: its curve runs to step {last}, this run trains to step "
                        f"{config.steps}; pass --steps {last} or a shorter reference")


def _check_run_inputs(args, cluster: ClusterSpec, model: ModelConfig, config: TrainConfig):
    """--out (a run to resume, or a folder free for this one) and --reference, checked before anything
    is written; the reference's loss log, or None."""
    if args.resume:
        check_resume(args.out, args, cluster, model)
    else:
        _check_out(args.out, args.overwrite)
    if not args.reference:
        return None
    reference = check_reference(args.reference, model)
    _check_reference_length(reference, config)
    return reference


def _plan_run(args, cluster: ClusterSpec, model: ModelConfig) -> tuple[str, PlannedStrategy | None]:
    """The profile folder, and the plan profiled, searched and written to --out (None when resuming:
    the folder's plan as it is, no profiling, no search)."""
    if args.resume:
        profiles = _read_json(os.path.join(args.out, PLAN_FILE)).get("profiles") or profile_folder(args, cluster, model)
        print(
            f"resuming the run in {args.out} with its plan {os.path.join(args.out, STRATEGY_FILE)} "
            f"(not planned again)", flush=True)
        return profiles, None
    profiles = profile(args, cluster, model)
    plan = make_plan(cluster, model, profiles)
    print_plan(plan, cluster, model)
    if not plan.report.fits:
        raise UserError(f"{args.cluster}: the best plan does not fit the memory model (see the table above)")
    write_plan(plan, args.out, args, cluster, model, profiles)
    for name in (METRICS_FILE, SUMMARY_FILE, STAGE_REPORT_FILE, PLOT_FILE):  # --overwrite: the earlier run's
        if os.path.exists(os.path.join(args.out, name)):
            os.remove(os.path.join(args.out, name))
    return profiles, plan


def _exit_on_sigterm(*_) -> None:
    """SIGTERM while profiling or planning ends `h2 run` as an exit does (status 143), so that its rank
    folders and multiprocessing's temporaries are removed, not left in TMPDIR."""
    raise SystemExit(128 + signal.SIGTERM)


def _cmd_run(args) -> int:
    config = _check_run_flags(args)
    cluster, model = _cluster_and_model(args)
    reference = _check_run_inputs(args, cluster, model, config)
    hold_output_folder(args.out)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # the launcher has its own from here on
    try:
        profiles, plan = _plan_run(args, cluster, model)
    finally:
        signal.signal(signal.SIGTERM, previous)
    status = train(args, args.out, cluster)
    if status != 0:
        print(f"h2 run: training failed (exit {status}); plan in {os.path.join(args.out, PLAN_FILE)}", flush=True)
        return status
    if args.nnodes > 1 and not os.path.exists(os.path.join(args.out, METRICS_FILE)):
        print("h2 run: this host holds no rank of the last stage; the summary is on the host that does")
        return 0
    if args.trace:
        write_traces(args.trace, plan or replayed_plan(cluster, model, args.out, profiles))
    print(f"summary of {args.out}:")
    return check(args.out, reference, args.threshold)


def _cmd_profile(args) -> int:
    cluster, model = _cluster_and_model(args)
    profile(args, cluster, model)
    return 0


def _cmd_plan(args) -> int:
    check_writable_folder(args.out, "--out")
    cluster, model = _cluster_and_model(args)
    _check_out(args.out, args.overwrite)
    profiles = profile_folder(args, cluster, model)
    plan = make_plan(cluster, model, profiles)
    print_plan(plan, cluster, model)
    write_plan(plan, args.out, args, cluster, model, profiles)
    print(f"wrote {os.path.join(args.out, STRATEGY_FILE)} and {os.path.join(args.out, PLAN_FILE)}")
    return 0


def _cmd_check(args) -> int:
    plan_path = os.path.join(args.run, PLAN_FILE)
    if not os.path.isfile(plan_path):
        raise UserError(f"--run {args.run}: no {PLAN_FILE} (h2 run or h2 plan writes it)")
    _check_threshold(args.threshold)
    model = ModelConfig(**_read_json(plan_path)["model_config"])
    reference = check_reference(args.reference, model) if args.reference else None
    return check(args.run, reference, args.threshold)


def add_parsers(sub) -> None:
    """`h2 run`, `h2 profile`, `h2 plan` and `h2 check` on the `h2` command's subparsers."""
    run = sub.add_parser("run", help="profile, plan, train and check on a cluster file in one command")
    _problem_flags(run)
    run.add_argument("--out", required=True, metavar="DIR", help="the run's folder: plan, metrics, summary")
    run.add_argument("--overwrite", action="store_true", help="start over in an --out that holds an earlier run")
    flags.add_flags(run, RunOptions, exclude=tuple(name for name in flags.field_names([RunOptions])
                                                   if name not in RUN_OPTIONS_IN_RUN))
    _reference_flags(run)
    hosts = run.add_argument_group("several hosts (not verified here: one host only)")
    hosts.add_argument(
        "--nnodes", type=int, default=1,
        help="hosts of the job: each runs `h2 run` with the same flags (and a shared --profiles "
        "folder, so every host plans the same strategy) and 1/N of the ranks (default 1)")
    hosts.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="torchrun's rendezvous, with --nnodes")
    flags.add_flags(run.add_argument_group("training"), TrainConfig, exclude=NOT_IN_RUN)
    flags.add_flags(run.add_argument_group("pipeline"), PipelineOptions)
    run.set_defaults(handler=_cmd_run)

    prof = sub.add_parser("profile", help="measure the cluster's chip types that have no up-to-date profile")
    _problem_flags(prof)
    prof.set_defaults(handler=_cmd_profile)

    plan = sub.add_parser("plan", help="search a strategy on measured profiles, print it with its predictions")
    _problem_flags(plan)
    plan.add_argument("--out", required=True, metavar="DIR", help="writes DIR/strategy.yaml and DIR/plan.json")
    plan.add_argument("--overwrite", action="store_true", help="replace a plan or run already in --out")
    plan.set_defaults(handler=_cmd_plan)

    check_cmd = sub.add_parser(
        "check", help="a run's measured vs predicted step time and memory, and its loss "
        "against a reference run")
    check_cmd.add_argument("--run", required=True, metavar="DIR", help="a folder h2 run wrote")
    _reference_flags(check_cmd)
    check_cmd.set_defaults(handler=_cmd_check)
