"""Send/recv + all-gather (SR&AG, "sliced") resharding against sending full tensors, on a pipeline of
two stages with TP 2 each (four local processes, gloo on 127.0.0.1, one thread per rank).

    .venv/bin/python benchmarks/bench_resharding.py [--steps 6] [--rounds 3]

Both modes run in the same processes, alternating rounds; each round times --steps optimizer steps
after a warm-up step. Time is reported for the best round of each and as the median over rounds of
the per-round ratio. On loopback every link is equally fast, so this measures the cost of the extra
all-gather, not the saving on a slow cross-node link that SR&AG is for. Bytes are those counted by HeteroPP's P2P layer: everything sent across the
stage boundary in one step, activations forward and gradients backward, summed over ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def strategy_data(args) -> dict:
    model = {"preset": "tiny", "hidden_size": args.hidden, "num_heads": 4, "num_kv_heads": 2,
             "intermediate_size": args.hidden * 2, "num_layers": 2, "max_seq_len": args.seq_len}
    return {"dp": 1, "micro_batches": args.micro_batches, "micro_batch_size": args.micro_batch_size,
            "seq_len": args.seq_len, "schedule": "1f1b", "model": model,
            "stages": [{"chip": "emu-a", "tp": 2, "layers": 1, "recompute": False},
                       {"chip": "emu-b", "tp": 2, "layers": 1, "recompute": False}]}


def _rank_main(rank: int, port: int, args, out_path: str) -> None:
    from h2.train import TrainConfig
    from heteropp.auto.strategy import strategy_from_mapping
    from heteropp.trainer import PipelineOptions, PipelineTrainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    strategy = strategy_from_mapping(strategy_data(args), "benchmark strategy")
    config = TrainConfig(steps=10**6)
    trainers = {mode: PipelineTrainer(strategy, config, None, PipelineOptions(resharding=mode))
                for mode in ("full", "sliced")}
    results = {mode: {"step_s": [], "bytes": 0} for mode in trainers}
    for _ in range(args.rounds):
        for mode, trainer in trainers.items():
            trainer.train_step()  # warm-up
            dist.barrier()
            started = time.perf_counter()
            for _ in range(args.steps):
                record = trainer.train_step()
            dist.barrier()
            results[mode]["step_s"].append((time.perf_counter() - started) / args.steps)
            results[mode]["bytes"] = record["cross_stage_bytes"]
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(results, handle)
    dist.destroy_process_group()


def run(args) -> dict:
    out_path = os.path.join(tempfile.mkdtemp(prefix="bench-reshard-"), "result.json")
    mp.start_processes(_rank_main, args=(_free_port(), args, out_path), nprocs=WORLD, join=True,
                       start_method="fork")
    with open(out_path) as handle:
        return json.load(handle)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args(argv)
    result = run(args)
    full, sliced = result["full"], result["sliced"]
    print(f"2 stages, TP 2 -> TP 2, hidden {args.hidden}, {args.micro_batches} micro-batches of "
          f"{args.micro_batch_size} x {args.seq_len} tokens, fp32, gloo, best of {args.rounds} rounds")
    print(f"full tensors:  {full['bytes']:>12,} bytes across stages per step, {min(full['step_s']) * 1e3:8.1f} ms/step")
    print(f"SR&AG sliced:  {sliced['bytes']:>12,} bytes across stages per step, {min(sliced['step_s']) * 1e3:8.1f} ms/step")
    ratios = sorted(s / f for s, f in zip(sliced["step_s"], full["step_s"]))
    print(f"ratio sliced / full: bytes {sliced['bytes'] / full['bytes']:.3f}, "
          f"time {min(sliced['step_s']) / min(full['step_s']):.3f} (best rounds), "
          f"{ratios[len(ratios) // 2]:.3f} (median of per-round ratios)")
    print("per round (sliced ms/step, full ms/step): " +
          ", ".join(f"({s * 1e3:.0f}, {f * 1e3:.0f})" for s, f in zip(sliced["step_s"], full["step_s"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
