"""A pipeline job, from the user's options to its running ranks (`h2 train --strategy S [--cluster C]`,
and `h2 run`'s training step): the options are checked once, the job is resolved once (the strategy as
it runs on the cluster: emulated stages on their device, JEEVES's orders generated; each rank's chip,
device and links), written as one file (h2.launch.job) and launched (h2.launch.launcher). The ranks
run what the file says; they check no user input and never read the strategy or cluster file.

Every refusal is one line (UserError) before any rank starts.
"""

from __future__ import annotations

import os
import sys

from h2.core import flags
from h2.core.cluster import ClusterSpec
from h2.core.dips import PSOptions
from h2.core.errors import UserError
from h2.core.run_lock import hold_output_folder
from h2.core.strategy import Strategy
from h2.core.training import PipelineOptions, RunOptions, TrainConfig
from h2.launch.contract import PeerLink, RankEntry, ResolvedJob, write_job

# Options a strategy file fixes (the model and batch shape).
NOT_WITH_STRATEGY = ("micro_batch_size", "micro_batches", "model_config", "preset")
DEFAULT_OUT = "runs/heteropp"
JOB_FILE = "job.yaml"


def flag_text(name: str) -> str:
    """An option's flag as the user types it: 'micro_batch_size' -> '--micro-batch-size'."""
    return "--" + name.replace("_", "-")


def run_pipeline_job(values: dict, run: RunOptions, hosts: tuple[int, str] | None = None,
                     cluster: ClusterSpec | None = None) -> int:
    """Check, resolve, write and launch the job of `values` (the options given: a --config file's, then
    the flags) with `run.strategy`; returns the ranks' exit status. `hosts` (number of hosts, rendezvous
    endpoint): this host's share of the ranks joins the others'. `cluster`: `run.cluster` already
    loaded by the caller (else it is loaded here, once)."""
    from h2.launch.launcher import job_folder, launch

    job, cluster = resolve_pipeline_job(values, run, cluster)
    if run.write_job:
        return write_job_for_hand_launch(job, run.write_job)
    with job_folder() as folder:  # the job file and torchrun's logs, removed however the job ends
        job_path = os.path.join(folder, JOB_FILE)
        write_job(job_path, job)
        return launch(job.strategy, cluster, job_path, run.strategy, hosts, max_restarts=run.max_restarts or 0,
                      stall_s=job.pipeline.rank_timeout)


def write_job_for_hand_launch(job: ResolvedJob, folder: str) -> int:
    """`--write-job DIR`: the resolved job as DIR/job.yaml (its ranks mark themselves finished beside it),
    and the torchrun line that starts its ranks on this host."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise UserError(f"--write-job {folder}: cannot create the folder ({error.strerror})") from None
    path = os.path.join(folder, JOB_FILE)
    write_job(path, job)
    ranks = job.strategy.world_size
    print(
        f"h2: wrote {path}; start its {ranks} ranks with: torchrun --standalone --nproc-per-node {ranks} "
        f"-m h2.cli.rank --job {path} (several hosts: --nnodes, --rdzv-backend c10d, --rdzv-endpoint)", flush=True)
    return 0


def resolve_pipeline_job(values: dict, run: RunOptions,
                         cluster: ClusterSpec | None = None) -> tuple[ResolvedJob, ClusterSpec | None]:
    """The job of `values` with `run.strategy` as its ranks run it, and its cluster (`cluster`, else
    `run.cluster` loaded here, once; None without one)."""
    from h2.core.cluster import load_cluster

    strategy, config, options = check_options(values, run)
    if run.cluster and cluster is None:
        cluster = load_cluster(run.cluster)
    return resolve_job(strategy, config, options, values, run, cluster), cluster


def check_options(values: dict, run: RunOptions) -> tuple[Strategy, TrainConfig, PipelineOptions]:
    """The strategy file and the options that go with it, each refusal one line."""
    from h2.core.strategy import load_strategy
    from h2.data import check_data_options
    from h2.train.loggers import check_available as check_loggers_available
    from heteropp.groups import check_p2p_backend
    from heteropp.job_checks import check_pipeline_job

    strategy = load_strategy(run.strategy)
    for name in NOT_WITH_STRATEGY:
        if values.get(name) is not None:
            raise UserError(f"{flag_text(name)} does not apply with --strategy "
                            f"(the strategy file fixes the model and batch shape)")
    if values.get("seq_len") is not None and strategy.seq_len and values["seq_len"] != strategy.seq_len:
        raise UserError(f"--seq-len {values['seq_len']} differs from {run.strategy}'s seq_len {strategy.seq_len} "
                        f"(the strategy file fixes the batch shape)")
    config = flags.build(TrainConfig, values)
    options = flags.build(PipelineOptions, values)
    check_p2p_backend(options.p2p_backend)
    check_pipeline_job(strategy, config, options, run.strategy)
    check_loggers_available(config.loggers)
    check_data_options(config, strategy.model_config(run.strategy))
    return strategy, config, options


def resolve_job(strategy: Strategy, config: TrainConfig, options: PipelineOptions, values: dict, run: RunOptions,
                cluster: ClusterSpec | None) -> ResolvedJob:
    """The job as its ranks run it: the strategy on `cluster` (checked against it, emulated stages on
    their device, JEEVES's orders generated), checked to fit and to start in its output folder."""
    from h2.core.stage_orders import run_schedule
    from h2.train.memory_check import check_pipeline_fits
    from h2.train.pipeline import pipeline_start

    warning = None
    if cluster is not None:
        strategy, warning = _on_cluster(strategy, cluster, options, run.strategy)
    check_pipeline_fits(strategy, config, cluster)
    if warning:
        print(f"h2: warning: {warning}", file=sys.stderr, flush=True)
    run_schedule(strategy, options.schedule, run.strategy)  # jeeves needs orders: generated above or the strategy's
    _check_stage_backends(strategy, config, options)
    _check_process_count(strategy, run)
    out = run.out or DEFAULT_OUT
    if not run.write_job:  # the folder is this run's from the first look at it (ranks started by hand take none)
        hold_output_folder(out)
    explicit = frozenset(name for name in values if name in flags.field_names([TrainConfig]))
    pipeline_start(strategy, config, out, resume=run.resume, overwrite=run.overwrite, explicit=explicit,
                   source=run.strategy)  # refuses what the ranks would, before any starts
    labels, stage_links = _cluster_descriptions(strategy, cluster)
    ranks = rank_entries(strategy, config, cluster)
    return ResolvedJob(source=run.strategy, strategy=strategy, train=config, pipeline=options, ps=flags.build(
        PSOptions, values), out=out, ranks=ranks, explicit=explicit, resume=run.resume, overwrite=run.overwrite,
                       chip_labels=labels, stage_links=stage_links)


def _on_cluster(strategy: Strategy, cluster: ClusterSpec, options: PipelineOptions,
                source: str) -> tuple[Strategy, str | None]:
    """The strategy as it runs on `cluster` with the orders it runs, and the warning for a busy host."""
    from h2.launch.cluster_job import check_job, host_warning
    from heteroauto.jeeves_plan import with_schedule_orders

    strategy = check_job(strategy, cluster, source, options.threads)
    strategy, generated = with_schedule_orders(strategy, cluster, options.schedule, source)
    if generated:
        print(f"h2: {generated}", flush=True)
    return strategy, host_warning(strategy, cluster)


def _check_stage_backends(strategy: Strategy, config: TrainConfig, options: PipelineOptions) -> None:
    from h2.core.devices import resolve_device
    from heteropp.groups import check_stage_backend

    for stage in strategy.stages:
        check_stage_backend(options.stage_backend, resolve_device(stage.device or config.device).type)


def _check_process_count(strategy: Strategy, run: RunOptions) -> None:
    needed = strategy.world_size
    nproc = run.nproc or needed
    if nproc != needed:
        raise UserError(f"{run.strategy}: needs {needed} processes (sum of tp * dp over stages), --nproc is {nproc}")


def rank_entries(strategy: Strategy, config: TrainConfig, cluster: ClusterSpec | None) -> tuple[RankEntry, ...]:
    """Each rank's chip, device, emulation, node and links (the last three only on a cluster)."""
    devices = [
        stage.device or config.device for stage, ranks in zip(strategy.stages, strategy.stage_ranks()) for _ in ranks
    ]
    if cluster is None:
        return tuple(RankEntry(chip=chip, device=device) for chip, device in zip(strategy.rank_chips(), devices))
    from h2.core.emulation import host_vendor_settings, rank_chips
    from h2.core.links import link_between, nodes_of, rank_locations

    locations = rank_locations(strategy, cluster)
    node_of = {rank: node for node, (_, ranks) in enumerate(nodes_of(locations)) for rank in ranks}
    entries = []
    for rank, (chip, here) in enumerate(zip(rank_chips(strategy, cluster), locations)):
        links = tuple(PeerLink(*link_between(cluster, here, there)) for there in locations)
        emulation = host_vendor_settings(chip) if chip.emulation is not None else None
        entries.append(
            RankEntry(chip=chip.name, device=devices[rank], emulation=emulation, node=node_of[rank], links=links,
                      vendor=chip.dipu_vendor))
    return tuple(entries)


def _cluster_descriptions(strategy: Strategy, cluster: ClusterSpec | None) -> tuple[dict | None, str | None]:
    """How the job's chips appear in outputs, and the link classes each stage boundary crosses."""
    if cluster is None:
        return None, None
    from h2.core.links import RankLinks, describe_stage_links
    from h2.launch.cluster_job import chip_labels

    return chip_labels(cluster), describe_stage_links(strategy, RankLinks.for_strategy(strategy, cluster, 0))
