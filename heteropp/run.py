"""`python -m heteropp.run --strategy S.yaml --steps N --out DIR`: one rank of a HeteroPP run.

Launched by torchrun (which sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), e.g.
    torchrun --standalone --nproc-per-node 4 -m heteropp.run --strategy S.yaml --steps 20 --out runs/pp
The strategy's stages need the sum of tp * dp over stages processes. Only the first rank of the last stage writes
metrics.jsonl and prints progress; rank 0 prints the topology.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

from h2.errors import UserError, run_cli

_TRAIN_OPTIONS = ("lr", "min_lr", "warmup_steps", "lr_decay_steps", "weight_decay", "grad_clip", "seed", "seq_len")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="heteropp.run", description="One rank of a HeteroPP pipeline run (launch with torchrun).")
    parser.add_argument("--strategy", required=True, metavar="YAML", help="strategy file (dp, micro-batches, stages)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    parser.add_argument("--out", help="output folder for metrics.jsonl (default runs/heteropp)")
    parser.add_argument("--device", default="cpu",
                        help="device type of every stage: cpu (default), dipu (through ditorch), cuda; "
                             "each rank takes the device of its local rank")
    parser.add_argument("--p2p-backend", default="gloo", help="backend for traffic across stages: gloo or dicomm")
    parser.add_argument("--stage-backend", default="auto",
                        help="backend of TP/DP groups inside a stage: auto (the chip's: gloo on cpu), gloo or dicomm")
    parser.add_argument("--resharding", default="sliced", choices=["sliced", "full"],
                        help="between stages: send/recv slices + all-gather (default) or full tensors")
    parser.add_argument("--optimizer-sharding", default="none", choices=["none", "zero1"],
                        help="ZeRO-1: shard AdamW state over each stage's data-parallel replicas")
    parser.add_argument("--schedule", choices=["1f1b", "1f1b-split-backward"], help="override the strategy's schedule")
    parser.add_argument("--no-prefetch", action="store_true", help="post receives only where the schedule lists them")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank (default 1)")
    parser.add_argument("--log-every", type=int, default=1, help="print a progress line every N steps")
    parser.add_argument("--lr", type=float)
    parser.add_argument("--min-lr", type=float)
    parser.add_argument("--warmup-steps", type=int)
    parser.add_argument("--lr-decay-steps", type=int)
    parser.add_argument("--weight-decay", type=float)
    parser.add_argument("--grad-clip", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--seq-len", type=int)
    return parser


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    import torch.distributed as dist

    from h2.train.config import TrainConfig
    from heteropp.auto.strategy import load_strategy
    from heteropp.groups import check_p2p_backend, check_stage_backend
    from heteropp.trainer import PipelineOptions, PipelineTrainer

    strategy = load_strategy(args.strategy)
    check_p2p_backend(args.p2p_backend)
    check_stage_backend(args.stage_backend)
    if not os.environ.get("WORLD_SIZE"):
        needed = strategy.world_size
        raise UserError(f"{args.strategy}: launch with torchrun --standalone --nproc-per-node {needed} "
                        f"-m heteropp.run ... (RANK/WORLD_SIZE are not set)")
    if args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    options = {name: getattr(args, name) for name in _TRAIN_OPTIONS if getattr(args, name) is not None}
    config = TrainConfig(steps=args.steps, **options)
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    try:
        trainer = PipelineTrainer(strategy, config, args.out or "runs/heteropp",
                                  PipelineOptions(p2p_backend=args.p2p_backend, stage_backend=args.stage_backend,
                                                  device=args.device,
                                                  resharding=args.resharding,
                                                  optimizer_sharding=args.optimizer_sharding,
                                                  prefetch=not args.no_prefetch, schedule=args.schedule),
                                  source=args.strategy)
        if trainer.rank == 0:
            print(trainer.topology.describe(default_device=args.device), flush=True)
        records = []
        while trainer.step < trainer.config.steps:
            record = trainer.train_step()
            records.append(record)
            if trainer.writes_metrics and (record["step"] % args.log_every == 0 or record["step"] == config.steps):
                print(f"step {record['step']} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                      f"grad_norm {record['grad_norm']:.3f} {record['tokens_per_s']:,.0f} tokens/s "
                      f"cross-stage {record['cross_stage_bytes']:,} B", flush=True)
        if trainer.writes_metrics and records:
            tokens = sum(r["tokens"] for r in records)
            seconds = sum(r["step_time_s"] for r in records)
            print(f"trained {trainer.model_config.name} with {trainer.topology.num_stages} stages on "
                  f"{trainer.topology.world_size} processes: {tokens / seconds:,.0f} tokens/s; "
                  f"metrics {trainer.metrics.path}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


main.prog = "heteropp.run"

if __name__ == "__main__":
    sys.exit(main())
