"""The `h2` command: `h2 train`, `h2 model-info`, and `h2 run` with its steps (h2.cli.run).

`h2 train`'s options are generated from the job's config classes (h2.core.training: RunOptions,
TrainConfig, PipelineOptions); `--config job.yaml` reads the same names from a file and flags given
on the command line override it. With `--strategy` the job runs as a HeteroPP pipeline: the launcher
writes the resolved job to a file and torchrun starts `python -m h2.cli.rank --config FILE` once per
chip of the strategy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from h2.core import flags
from h2.core.dips import PSOptions
from h2.core.errors import ArgumentParser, UserError, run_cli
from h2.core.training import PipelineOptions, RunOptions, TrainConfig

JOB_CONFIGS = (RunOptions, TrainConfig, PipelineOptions, PSOptions)
# Options a strategy file fixes (the model and batch shape).
NOT_WITH_STRATEGY = ("micro_batch_size", "micro_batches", "model_config", "preset")
# Options that only a pipeline has, with why a single-device run refuses each.
PIPELINE_ONLY = {"nproc": "a single-device run uses one process",
                 "max_restarts": "a single-device run has no ranks to restart; --resume continues it",
                 "cluster": "it says which chip each rank of a pipeline runs as and paces its links",
                 "log_every": "a single-device run shows a progress bar",
                 **{name: "it configures the pipeline" for name in flags.field_names([PipelineOptions])
                    if name != "log_every"}}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _model(run: RunOptions):
    from h2.core.model_config import load_model_config, preset
    if run.model_config:
        return load_model_config(run.model_config)
    return preset(run.preset or "tiny")


def job_from_args(args: argparse.Namespace) -> dict:
    """The job's values: the --config file's, then the flags given on the command line."""
    values = flags.job_values(args.config, JOB_CONFIGS) if args.config else {}
    for config in JOB_CONFIGS:
        values.update(flags.given(args, config))
    return values


def _train_pipeline(values: dict, run: RunOptions, hosts: tuple[int, str] | None = None) -> int:
    """`h2 train --strategy S [--cluster C]`: a HeteroPP run on local processes (h2.launch.launcher); with
    `hosts` (number of hosts, rendezvous endpoint) this host's share of the ranks joins the others."""
    from h2.launch.launcher import launch
    from h2.core.cluster import load_cluster
    from h2.core.devices import resolve_device
    from h2.core.stage_orders import run_schedule
    from h2.core.strategy import load_strategy
    from h2.train.memory_check import check_pipeline_fits
    from h2.train.pipeline import pipeline_start
    from heteropp.groups import check_p2p_backend, check_stage_backend
    from heteropp.job_checks import check_pipeline_job

    strategy = load_strategy(run.strategy)
    for name in NOT_WITH_STRATEGY:
        if values.get(name) is not None:
            raise UserError(f"{_flag(name)} does not apply with --strategy "
                            f"(the strategy file fixes the model and batch shape)")
    if values.get("seq_len") is not None and strategy.seq_len and values["seq_len"] != strategy.seq_len:
        raise UserError(f"--seq-len {values['seq_len']} differs from {run.strategy}'s seq_len {strategy.seq_len} "
                        f"(the strategy file fixes the batch shape)")
    config = flags.build(TrainConfig, values)
    options = flags.build(PipelineOptions, values)
    check_p2p_backend(options.p2p_backend)
    check_pipeline_job(strategy, config, options, run.strategy)
    cluster, warning = None, None
    if run.cluster:
        from h2.launch.cluster_job import check_job, host_warning
        from heteroauto.jeeves_plan import with_schedule_orders

        cluster = load_cluster(run.cluster)
        strategy = check_job(strategy, cluster, run.strategy, options.threads)
        strategy, generated = with_schedule_orders(strategy, cluster, options.schedule, run.strategy)
        if generated:
            print(f"h2: {generated}", flush=True)
        warning = host_warning(strategy, cluster)
    check_pipeline_fits(strategy, config, cluster)
    if warning:
        print(f"h2: warning: {warning}", file=sys.stderr, flush=True)
    run_schedule(strategy, options.schedule, run.strategy)  # jeeves needs orders: generated above or the strategy's
    for stage in strategy.stages:
        device_type = resolve_device(stage.device or config.device).type
        check_stage_backend(options.stage_backend, device_type)
    needed = strategy.world_size
    nproc = run.nproc or needed
    if nproc != needed:
        raise UserError(f"{run.strategy}: needs {needed} processes (sum of tp * dp over stages), --nproc is {nproc}")
    out = run.out or "runs/heteropp"
    explicit = frozenset(name for name in values if name in flags.field_names([TrainConfig]))
    pipeline_start(strategy, config, out, resume=run.resume, overwrite=run.overwrite, explicit=explicit,
                   source=run.strategy)  # refuses what the ranks would, before any starts
    job_folder = tempfile.mkdtemp(prefix="h2-job-")  # the job file and torchrun's logs
    job_path = os.path.join(job_folder, "job.yaml")
    try:
        flags.write_values(job_path, {**values, "strategy": run.strategy, "out": out})
        return launch(strategy, cluster, job_path, run.strategy, hosts, max_restarts=run.max_restarts or 0)
    finally:
        shutil.rmtree(job_folder, ignore_errors=True)


def _train(args: argparse.Namespace) -> int:
    values = job_from_args(args)
    run = flags.build(RunOptions, values)
    if run.strategy:
        return _train_pipeline(values, run)
    for name, reason in PIPELINE_ONLY.items():
        if values.get(name) is not None:
            raise UserError(f"{_flag(name)} needs --strategy ({reason})")
    from h2.train.trainer import Trainer, summarize_losses

    ps = flags.build(PSOptions, values)
    model_config = _model(run)
    if model_config.name == "h2-100b":
        raise UserError("preset 'h2-100b' is for planning only (103 B parameters); train tiny or small here")
    options = {name: value for name, value in values.items() if name in flags.field_names([TrainConfig])}
    config = TrainConfig(**options)
    out_dir = run.out or f"runs/{model_config.name}"
    trainer = Trainer(model_config, config, out_dir, resume=run.resume, overwrite=run.overwrite,
                      explicit=frozenset(options), show_progress=not run.quiet)
    start_step = trainer.step
    if ps.ps:
        from h2.train.ps_sync import run_with_ps
        records = run_with_ps(trainer, ps, show_progress=not run.quiet)
    else:
        records = trainer.run()
    cfg = trainer.config
    params = sum(p.numel() for p in trainer.model.parameters())
    throughput = (sum(r["tokens"] for r in records) / sum(r["step_time_s"] for r in records)) if records else 0.0
    resumed = f", resumed from step {start_step}" if run.resume else ""
    print(f"trained {model_config.name} ({params:,} parameters) on {trainer.device}, {cfg.dtype}, "
          f"steps {start_step + 1}..{trainer.step}{resumed}; global batch {cfg.global_batch} x {cfg.seq_len} tokens; "
          f"{throughput:,.0f} tokens/s")
    print(summarize_losses(records))
    print(f"metrics {trainer.metrics.path}; checkpoint {trainer.checkpoints.folder(trainer.step)}")
    return 0


def _model_info(args) -> int:
    config = _model(RunOptions(preset=args.preset, model_config=args.model_config))
    from heteropp.tensor_parallel import check_tp_divides
    check_tp_divides(config, args.tp, "--tp")
    seq = args.seq_len or config.max_seq_len
    mbs = args.micro_batch_size
    info = {
        "config": config.to_dict(),
        "parameters": config.num_parameters(),
        "parameters_per_layer": config.layer_params(),
        "embedding_parameters": config.embedding_params(),
        "head_parameters": config.head_params(),
        "flops_per_token": {
            "layer_forward": config.layer_forward_flops_per_token(seq),
            "layer_backward": config.layer_backward_flops_per_token(seq),
            "layer_recompute": config.layer_recompute_flops_per_token(seq),
            "head_forward": config.head_forward_flops_per_token(),
            "model_training": config.training_flops_per_token(seq),
        },
        "activation_bytes_per_layer": {
            "micro_batch_size": mbs, "seq_len": seq, "bytes_per_element": 2, "tp": args.tp,
            "stored": config.layer_activation_bytes(mbs, seq, tp=args.tp),
            "with_recompute": config.layer_recompute_activation_bytes(mbs, seq),
        },
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    flops, act = info["flops_per_token"], info["activation_bytes_per_layer"]
    print(f"model {config.name}: {config.num_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_heads} heads ({config.num_kv_heads} KV), intermediate {config.intermediate_size}, "
          f"vocab {config.vocab_size}, seq {config.max_seq_len}, "
          f"{'tied' if config.tie_embeddings else 'untied'} embeddings")
    print(f"parameters        {info['parameters']:>18,}  ({info['parameters'] / 1e9:.3f} B)")
    print(f"  per layer       {info['parameters_per_layer']:>18,}")
    print(f"  embedding       {info['embedding_parameters']:>18,}")
    print(f"  head            {info['head_parameters']:>18,}")
    print(f"FLOPs per token (seq {seq})")
    for key in ("layer_forward", "layer_backward", "layer_recompute", "head_forward", "model_training"):
        print(f"  {key:<16}{flops[key]:>18,}  ({flops[key] / 1e9:.3f} GFLOP)")
    print(f"activation bytes per layer per micro-batch (batch {mbs}, seq {seq}, 2-byte elements, tp {args.tp})")
    print(f"  kept for backward {act['stored']:>16,}  ({act['stored'] / 2**20:.1f} MiB)")
    print(f"  with recompute    {act['with_recompute']:>16,}  ({act['with_recompute'] / 2**20:.1f} MiB)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="h2", description="H2: train one LLM across heterogeneous accelerators.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    train = sub.add_parser("train", help="train a model on one device (the reference trainer), "
                                         "or as a HeteroPP pipeline with --strategy")
    train.add_argument("--config", metavar="YAML",
                       help="a job file: these options' names (with underscores) mapped to values; "
                            "flags given here override it")
    flags.add_flags(train.add_argument_group("run"), RunOptions)
    flags.add_flags(train.add_argument_group("training"), TrainConfig)
    flags.add_flags(train.add_argument_group("pipeline (with --strategy)"), PipelineOptions)
    flags.add_flags(train.add_argument_group("Di-PS cluster (with --ps)"), PSOptions)
    train.set_defaults(handler=_train)

    info = sub.add_parser("model-info", help="parameters, FLOPs and activation memory of a model")
    flags.add_flags(info, RunOptions, exclude=("strategy", "nproc", "cluster", "out", "resume", "overwrite", "quiet"))
    info.add_argument("--seq-len", type=int, help="sequence length (default: the model's max_seq_len)")
    info.add_argument("--micro-batch-size", type=int, default=1, help="for activation bytes (default 1)")
    info.add_argument("--tp", type=int, default=1, help="tensor-parallel size for activation bytes (default 1)")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(handler=_model_info)

    from h2.cli import ps, run
    ps.add_commands(sub)
    run.add_parsers(sub)
    return parser


@run_cli("h2")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("seq_len", "micro_batch_size", "tp"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
