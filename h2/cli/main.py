"""The `h2` command: `h2 train`, `h2 model-info`, `h2 generate` (h2.cli.generate), `h2 export` (h2.cli.export),
and `h2 run` with its steps (h2.cli.run).

`h2 train`'s options are generated from the job's config classes (h2.core.training: RunOptions,
TrainConfig, PipelineOptions); `--config job.yaml` reads the same names from a file and flags given
on the command line override it. With `--strategy` the job runs as a HeteroPP pipeline
(h2.launch.pipeline_job): the job is checked and resolved once, written to one file, and torchrun
starts `python -m h2.cli.rank --job FILE` once per chip of the strategy.

`h2 ps` (h2.cli.ps) and `h2 run` with its steps (h2.cli.run) add their subcommands to this parser;
neither imports this module.
"""

from __future__ import annotations

import argparse
import json
import sys

from h2.core import flags
from h2.core.dips import PSOptions
from h2.core.errors import ArgumentParser, UserError, run_cli
from h2.core.run_lock import hold_output_folder
from h2.core.training import PipelineOptions, RunOptions, TrainConfig
from h2.launch.pipeline_job import flag_text, run_pipeline_job

JOB_CONFIGS = (RunOptions, TrainConfig, PipelineOptions, PSOptions)
# Options that only a pipeline has, with why a single-device run refuses each.
PIPELINE_ONLY = {
    "nproc": "a single-device run uses one process",
    "max_restarts": "a single-device run has no ranks to restart; --resume continues it",
    "cluster": "it says which chip each rank of a pipeline runs as and paces its links",
    "write_job": "a single-device run has no ranks to start by hand",
    "log_every": "a single-device run shows a progress bar",
    **{name: "it configures the pipeline" for name in flags.field_names([PipelineOptions]) if name != "log_every"},
}


def _model(run: RunOptions, init_from: str | None = None):
    """--model-config, else --preset, else the --init-from folder's config.json, else tiny."""
    from h2.core.model_config import load_hf_model_config, load_model_config, preset
    if run.model_config:
        return load_model_config(run.model_config)
    if run.preset is None and init_from:
        return load_hf_model_config(init_from)
    return preset(run.preset or "tiny")


def job_from_args(args: argparse.Namespace) -> dict:
    """The job's values: the --config file's, then the flags given on the command line."""
    values = flags.job_values(args.config, JOB_CONFIGS) if args.config else {}
    for config in JOB_CONFIGS:
        values.update(flags.given(args, config))
    return values


def _check_inputs(model_config, config: TrainConfig) -> None:
    """What a single-device run reads besides its flags, checked before its output folder is created and
    locked: the data and tokenizer, the --init-from folder and the --log-to packages."""
    from h2.data import check_data_options
    from h2.model.hf_weights import check_init_from
    from h2.train.loggers import check_available
    check_data_options(config, model_config)
    if config.init_from:
        check_init_from(model_config, config.init_from)
    check_available(config.loggers)


def _train(args: argparse.Namespace) -> int:
    values = job_from_args(args)
    run = flags.build(RunOptions, values)
    if run.strategy:
        return run_pipeline_job(values, run)
    for name, reason in PIPELINE_ONLY.items():
        if values.get(name) is not None:
            raise UserError(f"{flag_text(name)} needs --strategy ({reason})")
    from h2.train.trainer import Trainer, summarize_losses

    ps = flags.build(PSOptions, values)
    model_config = _model(run, values.get("init_from"))
    if model_config.name == "h2-100b":
        raise UserError("preset 'h2-100b' is for planning only (103 B parameters); train tiny or small here")
    options = {name: value for name, value in values.items() if name in flags.field_names([TrainConfig])}
    config = TrainConfig(**options)
    out_dir = run.out or f"runs/{model_config.name}"
    _check_inputs(model_config, config)
    hold_output_folder(out_dir)
    trainer = Trainer(model_config, config, out_dir, resume=run.resume, overwrite=run.overwrite,
                      explicit=frozenset(options), show_progress=not run.quiet)
    start_step = trainer.step
    if ps.ps:
        from h2.train.ps_sync import run_with_ps
        records = run_with_ps(trainer, ps, show_progress=not run.quiet)
    else:
        records = trainer.run()
    trainer.metrics.close()  # the loggers' files complete (--log-to)
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
            "micro_batch_size": mbs,
            "seq_len": seq,
            "bytes_per_element": 2,
            "tp": args.tp,
            "stored": config.layer_activation_bytes(mbs, seq, tp=args.tp),
            "with_recompute": config.layer_recompute_activation_bytes(mbs, seq),
        },
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    flops, act = info["flops_per_token"], info["activation_bytes_per_layer"]
    print(f"model {config.name} ({config.family}): {config.num_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_heads} heads ({config.num_kv_heads} KV) of {config.head_dim}, "
          f"intermediate {config.intermediate_size}, "
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

    train = sub.add_parser(
        "train", help="train a model on one device (the reference trainer), "
        "or as a HeteroPP pipeline with --strategy")
    train.add_argument(
        "--config", metavar="YAML", help="a job file: these options' names (with underscores) mapped to values; "
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

    from h2.cli import data, export, generate, ps, run
    export.add_parser(sub)
    ps.add_commands(sub)
    run.add_parsers(sub)
    generate.add_parser(sub)
    data.add_commands(sub)
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
