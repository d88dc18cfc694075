"""One rank of a HeteroPP pipeline job, started by torchrun (which sets RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT):

    torchrun --standalone --nproc-per-node 4 -m h2.cli.rank --config job.yaml
    torchrun --standalone --nproc-per-node 4 -m h2.cli.rank --strategy S.yaml --steps 20 --out runs/pp
    torchrun --standalone --nproc-per-node 4 --max-restarts 1 -m h2.cli.rank --strategy S.yaml --out runs/pp

`h2 train --strategy` writes the options the user gave to a job file and passes only `--config`; by
hand, the flags of `h2 train` work here too and override the file. The strategy's stages need the
sum of tp * dp over stages processes. Only the first rank of the last stage writes metrics.jsonl and
stage_report.json (per stage: peak device memory, emulated kernel time and how much of it the host made
late, host CPU spent in steps) and prints progress; rank 0 prints the topology. Every rank writes its checkpoint shard (h2.train.pipeline).

Every rank watches the others (h2.train.watchdog): a rank that dies or stops responding for
`--rank-timeout` seconds ends every other rank, each with one line naming it, its stage and chip.
When torchrun restarts the job after such a failure (`--max-restarts`), the ranks continue from the
job's last checkpoint, or start over if it has none yet.

With `--cluster C` each rank runs as its stage's chip type of C: a chip with an `emulation:` section
is emulated on the dipu device (its vendor profile is written to OUT/emulated-chips/), after the
trust rule of h2.core.emulation was checked for the ranks of this host. Running out of the chip's
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

from h2.launch.contract import KERNEL_SHAPED_ENV, mark_finished, rank_names
from h2.core import flags
from h2.core.dips import PSOptions
from h2.core.emulation import host_cores, host_work_warning
from h2.core.errors import ArgumentParser, UserError, one_line, run_cli
from h2.core.training import PipelineOptions, RunOptions, TrainConfig

JOB_CONFIGS = (RunOptions, TrainConfig, PipelineOptions, PSOptions)
# Set in torchrun's store once this job has made its output folder its own: a restarted attempt
# continues from there instead of applying the fresh-run rule again.
FOLDER_PREPARED = "h2/job/folder-prepared"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="h2.cli.rank", description="One rank of a HeteroPP pipeline job (launch with torchrun).")
    parser.add_argument("--config", metavar="YAML", help="the job file (h2 train --strategy writes one); flags override it")
    flags.add_flags(parser.add_argument_group("run"), RunOptions, exclude=("quiet", "nproc", "max_restarts"))
    flags.add_flags(parser.add_argument_group("training"), TrainConfig)
    flags.add_flags(parser.add_argument_group("pipeline"), PipelineOptions)
    flags.add_flags(parser.add_argument_group("Di-PS cluster"), PSOptions)
    return parser


def _print_progress(record: dict, topology, memory: list[dict]) -> None:
    """The step's loss and throughput; per chip type the tokens/s each of its chips carries (the job's
    tokens/s times the type's share of the layers, over its chips); per stage the peak device memory."""
    share, chips = {}, {}   # per chip type: its share of the job's token-layers, its chips
    total_layers = sum(len(stage.layers) for stage in topology.stages)
    for stage in topology.stages:
        for replica in range(stage.dp):
            name = stage.replica_chip(replica)
            rows = len(stage.rows(replica)) / topology.micro_batch_sequences
            share[name] = share.get(name, 0.0) + rows * len(stage.layers) / total_layers
            chips[name] = chips.get(name, 0) + stage.tp
    per_chip = " ".join(f"{name} {record['tokens_per_s'] * share[name] / chips[name]:,.1f}" for name in share)
    peaks = " ".join(f"{row['stage']}:{row['peak_allocated_bytes'] / 1e6:.1f}"
                     for row in memory if row["peak_allocated_bytes"] is not None)
    print(f"step {record['step']} loss {record['loss']:.4f} lr {record['lr']:.2e} "
          f"grad_norm {record['grad_norm']:.3f} {record['tokens_per_s']:,.0f} tokens/s "
          f"(per chip: {per_chip}) cross-stage {record['cross_stage_bytes']:,} B"
          + (f" peak MB per stage {peaks}" if peaks else ""), flush=True)


def _is_communication_error(error: BaseException) -> bool:
    """Errors a collective raises when a peer is gone (gloo: 'Connection closed by peer', timeouts)."""
    import torch.distributed as dist

    return isinstance(error, (dist.DistError, RuntimeError)) and not isinstance(error, UserError)


@run_cli("h2.cli.rank")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    values = flags.job_values(args.config, JOB_CONFIGS) if args.config else {}
    for config in JOB_CONFIGS:
        values.update(flags.given(args, config))
    run = flags.build(RunOptions, values)
    if not run.strategy:
        raise UserError("--strategy (or a --config job file naming one) is required")
    import torch
    import torch.distributed as dist

    from h2.core.cluster import load_cluster
    from h2.core.links import RankLinks, describe_stage_links
    from h2.core.strategy import load_strategy
    from h2.train.pipeline import PipelineTrainer
    from h2.train.watchdog import RankWatchdog
    from heteropp.groups import check_p2p_backend, check_stage_backend
    from heteropp.topology import Topology

    strategy = load_strategy(run.strategy)
    config = flags.build(TrainConfig, values)
    options = flags.build(PipelineOptions, values)
    explicit = frozenset(name for name in values if name in flags.field_names([TrainConfig]))
    check_p2p_backend(options.p2p_backend)
    check_stage_backend(options.stage_backend)
    if not os.environ.get("WORLD_SIZE"):
        raise UserError(f"{run.strategy}: launch with torchrun --standalone --nproc-per-node {strategy.world_size} "
                        f"-m h2.cli.rank ... (RANK/WORLD_SIZE are not set)")
    out = run.out or "runs/heteropp"
    labels = links = None
    if run.cluster:
        from h2.launch.cluster_job import check_job, chip_labels, host_ranks_of_this_process, open_rank_chip
        from heteroauto.jeeves_plan import with_schedule_orders

        cluster = load_cluster(run.cluster)
        strategy = check_job(strategy, cluster, run.strategy, options.threads, host_ranks_of_this_process())
        strategy, _ = with_schedule_orders(strategy, cluster, options.schedule, run.strategy)
        open_rank_chip(strategy, cluster, int(os.environ["RANK"]), os.path.join(out, "emulated-chips"))
        labels = chip_labels(cluster)
        links = RankLinks.for_strategy(strategy, cluster, int(os.environ["RANK"]),
                                       kernel_shaped=os.environ.get(KERNEL_SHAPED_ENV) == "1")
    torch.set_num_threads(options.threads)
    describe = rank_names(Topology.from_strategy(strategy))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    timeout = timedelta(seconds=options.rank_timeout)
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    # torchrun's agent keeps one store across restarts: a restarted attempt must not read the
    # addresses the previous attempt's ranks published there.
    dist.init_process_group("gloo", store=dist.PrefixStore(f"h2/attempt/{attempt}/", store), rank=rank,
                            world_size=world_size, timeout=timeout)
    watchdog = RankWatchdog.connect(rank, world_size, timeout_s=options.rank_timeout, describe=describe,
                                    attempt=attempt).start()
    try:
        restarted = attempt > 0 and watchdog.store.check([FOLDER_PREPARED])
        trainer = PipelineTrainer(strategy, config, out, options, source=run.strategy, links=links,
                                  chip_labels=labels, resume=run.resume, overwrite=run.overwrite,
                                  restarted=restarted, explicit=explicit)
        if trainer.writes_metrics:
            watchdog.store.set(FOLDER_PREPARED, "1")
        if trainer.rank == 0:
            print(trainer.topology.describe(default_device=trainer.config.device, chip_labels=labels), flush=True)
            if links is not None:
                print(describe_stage_links(strategy, links), flush=True)
            if trainer.resumed_from is not None:
                how = ("re-sharded from another strategy" if trainer.resharded else "same strategy")
                print(f"resuming from step {trainer.step} ({trainer.resumed_from.folder}, {how})", flush=True)
        ps = flags.build(PSOptions, values)

        def show(record: dict) -> None:
            if record["step"] % options.log_every == 0 or record["step"] == trainer.config.steps:
                memory = trainer.engine.device_report()  # a collective: every rank takes part
                if trainer.writes_metrics:
                    _print_progress(record, trainer.topology, memory)

        if ps.ps:
            from h2.train.ps_pipeline import run_pipeline_with_ps
            records = run_pipeline_with_ps(trainer, ps, on_step=show)
        else:
            records = []
            while trainer.step < trainer.config.steps:
                records.append(trainer.train_step())
                show(records[-1])
        report = trainer.stage_report()
        trace = trainer.engine.write_trace()
        if trace is not None and trainer.rank == 0:
            print(f"trace of every rank in {os.path.dirname(trace)} (rank-<r>.json)", flush=True)
        leave_together(trainer.engine, watchdog,
                       job_folder=os.path.dirname(os.path.abspath(args.config)) if args.config else None)
        if trainer.writes_metrics and records:
            tokens = sum(r["tokens"] for r in records)
            seconds = sum(r["step_time_s"] for r in records)
            print(f"trained {trainer.model_config.name} with {trainer.topology.num_stages} stages on "
                  f"{trainer.topology.world_size} processes: {tokens / seconds:,.0f} tokens/s; "
                  f"metrics {trainer.metrics.path}", flush=True)
            _print_stage_report(report, labels or {}, trainer.elapsed_s)
    except torch.OutOfMemoryError as error:
        watchdog.report(f"{describe(rank)} failed: {one_line(error)}")
        print(f"h2.cli.rank: error: {one_line(error)}", file=sys.stderr, flush=True)
        return 1
    except Exception as error:
        if _is_communication_error(error):
            watchdog.stop_on_loss(within_s=options.rank_timeout)  # names the lost rank and exits, if one is
        watchdog.report(f"{describe(rank)} failed: {one_line(error)}")
        raise
    finally:
        dist.destroy_process_group()
    return 0


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
        print(f"stage {row['stage']} ({chip}): peak memory "
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
