"""The `h2` command line: `h2 train` and `h2 model-info`."""

from __future__ import annotations

import argparse
import json
import sys

from h2.errors import UserError, run_cli


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit 2 (argparse's own convention)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _model_from_args(args) -> "ModelConfig":
    from h2.model.config import load_model_config, preset
    if args.model_config:
        return load_model_config(args.model_config)
    return preset(args.preset)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--preset", default="tiny", help="model preset: tiny, small, h2-100b (default tiny)")
    group.add_argument("--model-config", metavar="YAML", help="a model YAML (fields of ModelConfig, or preset + overrides)")


_PIPELINE_PASSTHROUGH = ("steps", "lr", "min_lr", "warmup_steps", "lr_decay_steps", "weight_decay", "grad_clip",
                         "seed", "seq_len", "log_every", "stage_backend", "resharding", "optimizer_sharding",
                         "schedule", "device")
_NOT_WITH_STRATEGY = ("resume", "overwrite", "dtype", "micro_batch_size", "micro_batches", "model_config")


def _train_pipeline(args) -> int:
    """`h2 train --strategy S`: a HeteroPP run on local processes, launched with torchrun --standalone."""
    import subprocess

    from heteropp.auto.strategy import load_strategy
    strategy = load_strategy(args.strategy)
    for name in _NOT_WITH_STRATEGY:
        value = getattr(args, name)
        if value not in (None, False):
            raise UserError(f"--{name.replace('_', '-')} does not apply with --strategy "
                            f"(the strategy file fixes the model and batch shape)")
    from heteropp.groups import check_p2p_backend, check_stage_backend
    check_p2p_backend(args.p2p_backend)
    from h2.train.device import resolve_device
    for stage in strategy.stages:
        device_type = resolve_device(stage.device or args.device or "cpu").type
        check_stage_backend(args.stage_backend or "auto", device_type)
    needed = strategy.world_size
    nproc = args.nproc or needed
    if nproc != needed:
        raise UserError(f"{args.strategy}: needs {needed} processes (sum of tp * dp over stages), --nproc is {nproc}")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "heteropp.run", "--strategy", args.strategy, "--out", args.out or "runs/heteropp",
               "--p2p-backend", args.p2p_backend]
    for name in _PIPELINE_PASSTHROUGH:
        if getattr(args, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return subprocess.call(command)


def _train(args) -> int:
    from h2.train import TrainConfig
    from h2.train.trainer import Trainer, summarize_losses

    if args.strategy:
        return _train_pipeline(args)
    if args.nproc is not None:
        raise UserError("--nproc needs --strategy (a single-device run uses one process)")
    if args.log_every is not None:
        raise UserError("--log-every needs --strategy (a single-device run shows a progress bar)")
    for name in ("stage_backend", "resharding", "optimizer_sharding", "schedule"):
        if getattr(args, name) is not None:
            raise UserError(f"--{name.replace('_', '-')} needs --strategy (it configures the pipeline)")
    model_config = _model_from_args(args)
    if model_config.name == "h2-100b":
        raise UserError("preset 'h2-100b' is for planning only (103 B parameters); train tiny or small here")
    options = {name: getattr(args, name) for name in (
        "steps", "micro_batch_size", "micro_batches", "seq_len", "lr", "min_lr", "warmup_steps",
        "lr_decay_steps", "weight_decay", "grad_clip", "dtype", "seed", "device", "checkpoint_every",
        "keep_checkpoints") if getattr(args, name) is not None}
    explicit = frozenset(options)
    config = TrainConfig(**options)
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    out_dir = args.out or f"runs/{model_config.name}"
    trainer = Trainer(model_config, config, out_dir, resume=args.resume, overwrite=args.overwrite, explicit=explicit,
                      show_progress=not args.quiet)
    start_step = trainer.step
    records = trainer.run()
    cfg = trainer.config
    params = sum(p.numel() for p in trainer.model.parameters())
    throughput = (sum(r["tokens"] for r in records) / sum(r["step_time_s"] for r in records)) if records else 0.0
    resumed = f", resumed from step {start_step}" if args.resume else ""
    print(f"trained {model_config.name} ({params:,} parameters) on {trainer.device}, {cfg.dtype}, "
          f"steps {start_step + 1}..{trainer.step}{resumed}; global batch {cfg.global_batch} x {cfg.seq_len} tokens; "
          f"{throughput:,.0f} tokens/s")
    print(summarize_losses(records))
    print(f"metrics {trainer.metrics.path}; checkpoint {trainer.checkpoints.file_for(trainer.step)}")
    return 0


def _model_info(args) -> int:
    config = _model_from_args(args)
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
    parser = _Parser(prog="h2", description="H2: train one LLM across heterogeneous accelerators.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train a model on one device (the reference trainer), "
                                         "or as a HeteroPP pipeline with --strategy")
    _add_model_arguments(train)
    train.add_argument("--strategy", metavar="YAML", help="a HeteroPP strategy: run the pipeline on local processes "
                                                         "(torchrun --standalone)")
    train.add_argument("--nproc", type=int, help="processes for --strategy (default: sum of tp * dp over stages)")
    train.add_argument("--p2p-backend", default="gloo", help="with --strategy: backend across stages, gloo or dicomm")
    train.add_argument("--stage-backend", help="with --strategy: backend of TP/DP groups inside a stage, "
                                               "auto (default: the chip's, gloo on cpu), gloo or dicomm")
    train.add_argument("--resharding", choices=["sliced", "full"],
                       help="with --strategy: between stages, send/recv slices + all-gather (default) or full tensors")
    train.add_argument("--optimizer-sharding", choices=["none", "zero1"],
                       help="with --strategy: ZeRO-1 over each stage's data-parallel replicas (default none)")
    train.add_argument("--schedule", choices=["1f1b", "1f1b-split-backward"],
                       help="with --strategy: override the strategy's schedule")
    train.add_argument("--out", help="output folder for metrics.jsonl and checkpoints/ (default runs/<model>)")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    train.add_argument("--overwrite", action="store_true", help="start over in an --out that holds an earlier run")
    train.add_argument("--steps", type=int, help="train until this many optimizer steps in total (default 200)")
    train.add_argument("--device", help="torch device: cpu (default), cuda, cuda:N, dipu; with --strategy a device "
                                        "type for every stage")
    train.add_argument("--dtype", choices=["fp32", "bf16"], help="compute precision (default fp32)")
    train.add_argument("--micro-batch-size", type=int, help="sequences per micro-batch (default 8)")
    train.add_argument("--micro-batches", type=int, help="micro-batches accumulated per step (default 1)")
    train.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's max_seq_len)")
    train.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    train.add_argument("--min-lr", type=float, help="final learning rate of the cosine (default 3e-4)")
    train.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default 20)")
    train.add_argument("--lr-decay-steps", type=int, help="cosine horizon in steps (default: --steps of the first run)")
    train.add_argument("--weight-decay", type=float, help="AdamW weight decay on matrices (default 0.1)")
    train.add_argument("--grad-clip", type=float, help="max global gradient norm, 0 to disable (default 1.0)")
    train.add_argument("--seed", type=int, help="seed for initialisation and data order (default 0)")
    train.add_argument("--checkpoint-every", type=int, help="checkpoint every N steps, 0 for only at the end (default 100)")
    train.add_argument("--keep-checkpoints", type=int, help="how many checkpoints to keep (default 2)")
    train.add_argument("--log-every", type=int, help="with --strategy: print a metrics line every N steps")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(handler=_train)

    info = sub.add_parser("model-info", help="parameters, FLOPs and activation memory of a model")
    _add_model_arguments(info)
    info.add_argument("--seq-len", type=int, help="sequence length (default: the model's max_seq_len)")
    info.add_argument("--micro-batch-size", type=int, default=1, help="for activation bytes (default 1)")
    info.add_argument("--tp", type=int, default=1, help="tensor-parallel size for activation bytes (default 1)")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(handler=_model_info)
    return parser


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("seq_len", "micro_batch_size", "tp"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return args.handler(args)


main.prog = "h2"

if __name__ == "__main__":
    sys.exit(main())
