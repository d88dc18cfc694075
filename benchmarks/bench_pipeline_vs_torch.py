"""HeteroPP's 1F1B against torch.distributed.pipelining's Schedule1F1B on the same homogeneous
4-stage pipeline, model, micro-batches and processes (gloo on 127.0.0.1, one thread per rank).

    .venv/bin/python benchmarks/bench_pipeline_vs_torch.py [--steps 8] [--rounds 3]

Both run in the same four processes, alternating rounds (ours, torch, ours, torch, ...) so that load
from elsewhere on the machine hits both alike; each round times --steps optimizer steps after a
warm-up step, between barriers. A step is the whole iteration: schedule, gradient-norm clip, AdamW.
HeteroPP additionally all-reduces the global gradient norm; torch's baseline clips per stage.
Reported: tokens/s of the best round of each and their ratio, and the median over rounds of the
per-round ratio (the pair of a round ran back to back, under the same outside load).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from h2.core.ranks import run_ranks

STAGES = 4


def strategy_data(args) -> dict:
    model = {
        "preset": "tiny", "hidden_size": args.hidden, "num_heads": 4, "num_kv_heads": 2,
        "intermediate_size": args.hidden * 11 // 4, "num_layers": args.layers, "max_seq_len": args.seq_len
    }
    return {
        "dp": 1, "micro_batches": args.micro_batches, "micro_batch_size": args.micro_batch_size,
        "seq_len": args.seq_len, "schedule": "1f1b", "model": model, "stages": [{
            "chip": "emu", "tp": 1, "layers": args.layers // STAGES, "recompute": False
        } for _ in range(STAGES)]
    }


def _timed(step, steps: int) -> float:
    step()  # warm-up
    dist.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    return (time.perf_counter() - started) / steps


def _rank_main(rank: int, world_size: int, args) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from h2.core.strategy import strategy_from_mapping
    from h2.data import SequenceStream, load_stdlib_corpus
    from h2.model.transformer import Transformer, language_model_loss
    from h2.train import TrainConfig
    from h2.train.pipeline import PipelineTrainer
    from h2.train.trainer import build_adamw
    from heteropp.stage import build_stage

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=300))
    strategy = strategy_from_mapping(strategy_data(args), "benchmark strategy")
    config = TrainConfig(steps=10**6, grad_clip=1.0)
    ours = PipelineTrainer(strategy, config, None)

    model_config = strategy.model_config()
    torch.manual_seed(0)
    per_stage = args.layers // STAGES
    module = build_stage(Transformer(model_config), range(rank * per_stage, (rank + 1) * per_stage), first=rank == 0,
                         last=rank == STAGES - 1)
    stage = PipelineStage(module, rank, STAGES, torch.device("cpu"))
    schedule = Schedule1F1B(stage, args.micro_batches, loss_fn=language_model_loss)
    optimizer = build_adamw(module, config)
    stream = SequenceStream(load_stdlib_corpus(), args.seq_len, seed=0)

    def torch_step():
        batch = stream.next_batch(args.micro_batches * args.micro_batch_size)
        if rank == 0:
            schedule.step(batch[:, :-1])
        elif rank == STAGES - 1:
            schedule.step(target=batch[:, 1:])
        else:
            schedule.step()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    results = {"ours": [], "torch": []}
    for _ in range(args.rounds):
        results["ours"].append(_timed(ours.train_step, args.steps))
        results["torch"].append(_timed(torch_step, args.steps))
    dist.destroy_process_group()
    return results  # between barriers: every rank times the same steps; rank 0's are reported


def run(args) -> dict:
    # forkserver: the ranks fork from a server that imported torch once, not from this process
    results = run_ranks(_rank_main, STAGES, (args, ), timeout=None, start_method="forkserver",
                        preload=["torch", "h2.model", "heteropp"])[0]
    tokens = args.micro_batches * args.micro_batch_size * args.seq_len
    ratios = sorted(t / o for o, t in zip(results["ours"], results["torch"]))
    return {name: tokens / min(times)
            for name, times in results.items()} | {"rounds": results, "median_ratio": ratios[len(ratios) // 2]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args(argv)
    result = run(args)
    print(f"4-stage 1F1B, hidden {args.hidden}, {args.layers} layers, {args.micro_batches} micro-batches of "
          f"{args.micro_batch_size} x {args.seq_len} tokens, gloo, 1 thread per rank, best of {args.rounds} rounds")
    print(f"torch.distributed.pipelining Schedule1F1B: {result['torch']:10,.0f} tokens/s")
    print(f"HeteroPP 1f1b:                             {result['ours']:10,.0f} tokens/s")
    print(f"ratio ours / torch (best rounds): {result['ours'] / result['torch']:.3f}; "
          f"median of per-round ratios: {result['median_ratio']:.3f}")
    pairs = zip(result["rounds"]["ours"], result["rounds"]["torch"])
    print("per round (ours ms/step, torch ms/step): " + ", ".join(f"({o * 1e3:.0f}, {t * 1e3:.0f})" for o, t in pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
