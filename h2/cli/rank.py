"""One rank of a HeteroPP pipeline job, started by torchrun (which sets RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) on the job file the launcher wrote (h2.launch.pipeline_job, h2.launch.job):

    h2 train --strategy S.yaml [--cluster C.yaml] ...     # checks and resolves the job, then runs:
    torchrun --standalone --nproc-per-node 4 -m h2.cli.rank --job JOB.yaml

The job file is the resolved job: the strategy as it runs (its orders included), the training options,
and each rank's chip, device and links. A rank checks none of it again and reads no other input file
(no strategy file, no cluster file) and never imports the planner. Only the first rank of the last
stage writes metrics.jsonl and stage_report.json (per stage: peak device memory, emulated kernel time
and how much of it the host made late, host CPU spent in steps) and prints progress; rank 0 prints the
topology. Every rank writes its checkpoint shard (h2.train.pipeline).

Every rank watches the others (h2.train.watchdog): a rank that dies or stops responding for
`--rank-timeout` seconds ends every other rank, each with one line naming it, its stage and chip.
When torchrun restarts the job after such a failure (`--max-restarts`), the ranks continue from the
job's last checkpoint, or start over if it has none yet.

A rank whose chip has an `emulation:` section in the cluster file runs on the dipu device as that chip
(its vendor profile, from the job file, is written to OUT/emulated-chips/). Running out of the chip's
memory ends the rank with one line naming the stage and the chip (exit status 1).

A rank ends with os._exit once its output is flushed: an autograd device thread may still be
releasing its last graph when the interpreter shuts down, which aborts the process
(pytorch/pytorch#38228) and would turn a finished run into a failed one.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

from h2.core.emulation import host_cores, host_work_warning
from h2.core.errors import ArgumentParser, UserError, one_line, run_cli
from h2.launch.contract import KERNEL_SHAPED_ENV, ResolvedJob, mark_finished, rank_names, read_job
from h2.train.progress import validation_text

# Set in torchrun's store once this job has made its output folder its own: a restarted attempt
# continues from there instead of applying the fresh-run rule again.
FOLDER_PREPARED = "h2/job/folder-prepared"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="h2.cli.rank", description="One rank of a HeteroPP pipeline job under torchrun "
        "(h2 train --strategy writes the job file and starts it).")
    parser.add_argument("--job", metavar="YAML", required=True, help="the resolved job file (h2.launch.job)")
    return parser


def _print_progress(record: dict, topology) -> None:
    """The step's loss and throughput, and its validation loss where it evaluated; per chip type the
    tokens/s each of its chips carries (the job's tokens/s times the type's share of the layers, over its
    chips); per stage the peak device memory (the record's, h2.train.pipeline)."""
    share, chips = {}, {}  # per chip type: its share of the job's token-layers, its chips
    total_layers = sum(len(stage.layers) for stage in topology.stages)
    for stage in topology.stages:
        for replica in range(stage.dp):
            name = stage.replica_chip(replica)
            rows = len(stage.rows(replica)) / topology.micro_batch_sequences
            share[name] = share.get(name, 0.0) + rows * len(stage.layers) / total_layers
            chips[name] = chips.get(name, 0) + stage.tp
    per_chip = " ".join(f"{name} {record['tokens_per_s'] * share[name] / chips[name]:,.1f}" for name in share)
    peaks = " ".join(f"{stage}:{peak / 1e6:.1f}" for stage, peak in enumerate(record.get("peak_allocated_bytes") or ())
                     if peak is not None)
    print(
        f"step {record['step']} loss {record['loss']:.4f}{validation_text(record)} lr {record['lr']:.2e} "
        f"grad_norm {record['grad_norm']:.3f} {record['tokens_per_s']:,.0f} tokens/s "
        f"(per chip: {per_chip}) cross-stage {record['cross_stage_bytes']:,} B" +
        (f" peak MB per stage {peaks}" if peaks else ""), flush=True)


def _is_communication_error(error: BaseException) -> bool:
    """Errors a collective raises when a peer is gone (gloo: 'Connection closed by peer', timeouts)."""
    import torch.distributed as dist

    return isinstance(error, (dist.DistError, RuntimeError)) and not isinstance(error, UserError)


@run_cli("h2.cli.rank")
def main(argv: list[str] | None = None) -> int:
    job_path = build_parser().parse_args(argv).job
    job = read_job(job_path)
    rank = torchrun_rank(job)
    open_chip(job, rank)
    links = job.links(rank, kernel_shaped=os.environ.get(KERNEL_SHAPED_ENV) == "1")
    return run_rank(job, links, job_folder=os.path.dirname(os.path.abspath(job_path)))


def torchrun_rank(job: ResolvedJob) -> int:
    """This process's global rank, as torchrun set it."""
    if not os.environ.get("WORLD_SIZE"):
        raise UserError(f"{job.source}: launch with torchrun --standalone --nproc-per-node {job.strategy.world_size} "
                        f"-m h2.cli.rank --job FILE, or with h2 train --strategy (RANK/WORLD_SIZE are not set)")
    return int(os.environ["RANK"])


def torchrun_attempt() -> int:
    """How many times torchrun has restarted the job's ranks (0: the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def open_chip(job: ResolvedJob, rank: int) -> str | None:
    """Make this process's dipu device the emulated chip of `rank` on its chip's vendor (before the device
    first opens); the profile's path, or None for a chip that runs as it is."""
    entry = job.ranks[rank]
    from heteropp.emulated_chip import load_chip_vendor, open_emulated_device

    load_chip_vendor(entry.vendor)
    if entry.emulation is None:
        return None
    return open_emulated_device(entry.emulation, os.path.join(job.out, "emulated-chips"))


def run_rank(job: ResolvedJob, links, job_folder: str | None = None) -> int:
    """Join the job's process group, train under the watchdog, leave together with the other ranks and
    report; the exit status (1: this rank's chip ran out of memory)."""
    import torch
    import torch.distributed as dist

    from heteropp.topology import Topology

    torch.set_num_threads(job.pipeline.threads)
    describe = rank_names(Topology.from_strategy(job.strategy))
    rank, watchdog = join_job(job, describe)
    try:
        trainer = build_trainer(job, links, watchdog)
        announce(trainer, job)
        records = train(trainer, job)
        finish(trainer, job, watchdog, records, job_folder)
    except torch.OutOfMemoryError as error:
        watchdog.report(f"{describe(rank)} failed: {one_line(error)}")
        print(f"h2.cli.rank: error: {one_line(error)}", file=sys.stderr, flush=True)
        return 1
    except Exception as error:
        if _is_communication_error(error):
            watchdog.stop_on_loss(within_s=job.pipeline.rank_timeout)  # names the lost rank and exits, if one is
        watchdog.report(f"{describe(rank)} failed: {one_line(error)}")
        raise
    finally:
        dist.destroy_process_group()
    return 0


def join_job(job: ResolvedJob, describe):
    """This rank in the job's gloo process group (one per torchrun attempt), watched by the others."""
    import torch.distributed as dist

    from h2.train.watchdog import RankWatchdog

    attempt = torchrun_attempt()
    timeout = timedelta(seconds=job.pipeline.rank_timeout)
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    # torchrun's agent keeps one store across restarts: a restarted attempt must not read the
    # addresses the previous attempt's ranks published there.
    dist.init_process_group("gloo", store=dist.PrefixStore(f"h2/attempt/{attempt}/", store), rank=rank,
                            world_size=world_size, timeout=timeout)
    watchdog = RankWatchdog.connect(rank, world_size, timeout_s=job.pipeline.rank_timeout, describe=describe,
                                    attempt=attempt).start()
    return rank, watchdog


def build_trainer(job: ResolvedJob, links, watchdog):
    """The rank's PipelineTrainer; a restarted attempt continues in the folder its job made its own."""
    import torch.distributed as dist

    from h2.data import prepare_data_cache
    from h2.train.pipeline import PipelineTrainer, data_cache_dir

    if job.out is not None and dist.get_rank() == 0:  # the others find the data prepared
        prepare_data_cache(job.train, data_cache_dir(job.out))
    dist.barrier()
    restarted = torchrun_attempt() > 0 and watchdog.store.check([FOLDER_PREPARED])
    trainer = PipelineTrainer(job.strategy, job.train, job.out, job.pipeline, source=job.source, links=links,
                              chip_labels=job.chip_labels, resume=job.resume, overwrite=job.overwrite,
                              restarted=restarted, explicit=job.explicit)
    if trainer.writes_metrics:
        watchdog.store.set(FOLDER_PREPARED, "1")
    return trainer


def announce(trainer, job: ResolvedJob) -> None:
    """Rank 0 prints the topology, the links each stage boundary crosses, and where it resumed from."""
    if trainer.rank != 0:
        return
    print(trainer.topology.describe(default_device=trainer.config.device, chip_labels=job.chip_labels), flush=True)
    if job.stage_links is not None:
        print(job.stage_links, flush=True)
    if trainer.resumed_from is not None:
        how = ("re-sharded from another strategy" if trainer.resharded else "same strategy")
        print(f"resuming from step {trainer.step} ({trainer.resumed_from.folder}, {how})", flush=True)


def train(trainer, job: ResolvedJob) -> list[dict]:
    """The steps up to the job's last (with Di-PS: its outer loop), showing progress every log_every."""

    def show(record: dict) -> None:
        if record["step"] % job.pipeline.log_every == 0 or record["step"] == trainer.config.steps:
            if trainer.writes_metrics:
                _print_progress(record, trainer.topology)

    if job.ps.ps:
        from h2.train.ps_pipeline import run_pipeline_with_ps
        return run_pipeline_with_ps(trainer, job.ps, on_step=show)
    records = []
    while trainer.step < trainer.config.steps:
        records.append(trainer.train_step())
        show(records[-1])
    return records


def finish(trainer, job: ResolvedJob, watchdog, records: list[dict], job_folder: str | None) -> None:
    """The stage report and trace, the final barrier with the other ranks, then the run's summary."""
    report = trainer.stage_report()
    if trainer.metrics is not None:
        trainer.metrics.close()  # the loggers' files complete (--log-to)
    trace = trainer.engine.write_trace()
    if trace is not None and trainer.rank == 0:
        print(f"trace of every rank in {os.path.dirname(trace)} (rank-<r>.json)", flush=True)
    leave_together(trainer.engine, watchdog, job_folder=job_folder)
    if trainer.writes_metrics and records:
        tokens = sum(r["tokens"] for r in records)
        seconds = sum(r["step_time_s"] for r in records)
        print(
            f"trained {trainer.model_config.name} with {trainer.topology.num_stages} stages on "
            f"{trainer.topology.world_size} processes: {tokens / seconds:,.0f} tokens/s; "
            f"metrics {trainer.metrics.path}", flush=True)
        _print_stage_report(report, job.chip_labels or {}, trainer.elapsed_s)


def leave_together(engine, watchdog, job_folder: str | None = None) -> None:
    """No rank leaves (and takes a store or a peer with it) before all are done: a barrier, still
    under the watchdog, so that a peer frozen or killed before it is found like any other; then this
    rank marks itself finished in `job_folder` (for the launcher) and stops watching (and tells the
    others it finished)."""
    engine.barrier()
    if job_folder is not None:
        mark_finished(job_folder, watchdog.rank)
    watchdog.stop()


def _print_stage_report(report: list[dict], labels: dict[str, str], elapsed_s: float) -> None:
    for row in report:
        if row["peak_allocated_bytes"] is None:
            continue
        late = (f", {row['late_kernels']:,} of {row['kernels']:,} kernels late by {row['overrun_s']:.3f} s "
                f"in all ({row['overrun_s'] / row['emulated_s']:.2%} of the emulated kernel time)"
                if row["kernels"] else "")
        host = f"; its ranks used {row['host_cpu_s'] / elapsed_s:.2f} host cores in steps" if elapsed_s > 0 else ""
        chip = " + ".join(labels.get(name, name) for name in row["chip"].split("+"))
        vendor = f" on the {row['vendor']} vendor" if row.get("vendor") else ""
        print(
            f"stage {row['stage']} ({chip}){vendor}: peak memory "
            f"{row['peak_allocated_bytes'] / 1e6:.2f} MB{late}{host}", flush=True)
    emulated = [row for row in report if row["kernels"] and row["peak_allocated_bytes"] is not None]
    if emulated and elapsed_s > 0:
        warning = host_work_warning(sum(row["host_cpu_s"] for row in emulated) / elapsed_s, host_cores())
        if warning:
            print(f"warning: {warning}", flush=True)


if __name__ == "__main__":
    code = main()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
