"""Send/recv + all-gather (SR&AG, "sliced") resharding against sending full tensors, on a pipeline of
two stages with TP 2 each (four local processes, one thread per rank).

    .venv/bin/python benchmarks/bench_resharding.py [--rounds 5] [--steps 3] [--transfer-mib 1,16,64]

Two link layouts, both modes each, all in the same processes:
  uniform   every group on gloo over 127.0.0.1: the stage boundary is no slower than the link inside
            a stage, so SR&AG can only pay for its extra all-gather;
  topology  TP/DP groups inside a stage on dicomm (shared memory: the fast intra-node fabric of one
            chip type's server) and the stage boundary on gloo TCP (the network between servers),
            the situation SR&AG is for (H2 paper, section 5 and Figure 10).
Two measurements:
  transfer  one activation of --transfer-mib MiB moved across the boundary and reassembled on every
            receiver, repeatedly after a barrier each; the median over transfers of the slowest
            rank's time (a 100B model's activation is 4096 x 8192 x 2 bytes = 64 MiB per sequence);
  step      a whole optimizer step of the pipeline (1f1b, 4 micro-batches), alternating rounds;
            best round of each mode and the median of the per-round ratios.
Bytes are those counted by HeteroPP's P2P layer: everything sent across the stage boundary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from h2.core.ranks import run_ranks

WORLD = 4
MODES = ("full", "sliced")
LAYOUTS = {
    "uniform": {"p2p_backend": "gloo", "stage_backend": "gloo"},
    "topology": {"p2p_backend": "gloo", "stage_backend": "dicomm"}
}


def strategy_data(args) -> dict:
    model = {
        "preset": "tiny", "hidden_size": args.hidden, "num_heads": 4, "num_kv_heads": 2,
        "intermediate_size": args.hidden * 2, "num_layers": 2, "max_seq_len": args.seq_len
    }
    return {
        "dp": 1, "micro_batches": args.micro_batches, "micro_batch_size": args.micro_batch_size,
        "seq_len": args.seq_len, "schedule": "1f1b", "model": model, "stages": [{
            "chip": "emu-a", "tp": 2, "layers": 1, "recompute": False
        }, {"chip": "emu-b", "tp": 2, "layers": 1, "recompute": False}]
    }


def time_transfers(resharder, groups, mib: int) -> tuple[list[float], int]:
    """Per transfer, the slowest rank's seconds to move one activation of `mib` MiB across the boundary."""
    rows = resharder.stage.micro_batch_size
    shape = (rows, (mib << 20) // (rows * 256 * 4), 256)
    activation = torch.randn(shape)
    sending = resharder.place.stage == 0
    transfers = max(10, min(200, 400 // mib))
    bytes_before = resharder.p2p.bytes_sent
    seconds = torch.zeros(transfers, dtype=torch.float64)
    for i in range(transfers + 5):
        dist.barrier(group=groups.everyone)
        started = time.perf_counter()
        if sending:
            resharder.send(activation, 1, micro_batch=0)
            resharder.p2p.wait_sends()
        else:
            resharder.post_recv(shape, activation.dtype, 0, micro_batch=0).wait()
        if i >= 5:
            seconds[i - 5] = time.perf_counter() - started
    sent = torch.tensor([float(resharder.p2p.bytes_sent - bytes_before)], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=groups.everyone)
    dist.all_reduce(sent, group=groups.everyone)
    return seconds.tolist(), int(sent.item()) // (transfers + 5)


def _rank_main(rank: int, world_size: int, args) -> dict:
    import dicomm  # noqa: F401  (registers the backend)
    from h2.core.strategy import strategy_from_mapping
    from h2.core.training import PipelineOptions
    from h2.train import TrainConfig
    from h2.train.pipeline import PipelineTrainer
    from heteropp.groups import build_groups
    from heteropp.p2p import P2P
    from heteropp.resharding import Resharder
    from heteropp.topology import Topology

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=300))
    strategy = strategy_from_mapping(strategy_data(args), "benchmark strategy")
    config = TrainConfig(steps=10**6)
    topology = Topology.from_strategy(strategy)
    results = {}
    for layout, backends in LAYOUTS.items():
        groups = build_groups(topology, rank, **backends)
        for mode in MODES:
            resharder = Resharder(topology, rank, groups, P2P(), mode=mode)
            transfers = {}
            for mib in args.transfer_mib:
                seconds, nbytes = time_transfers(resharder, groups, mib)
                transfers[str(mib)] = {"seconds": seconds, "bytes": nbytes}
            results[f"{layout}/{mode}"] = {"transfers": transfers, "step_s": [], "bytes": 0}
        trainers = {
            mode: PipelineTrainer(strategy, config, None, PipelineOptions(resharding=mode, **backends))
            for mode in MODES
        }
        for _ in range(args.rounds):
            for mode, trainer in trainers.items():
                trainer.train_step()  # warm-up
                dist.barrier()
                started = time.perf_counter()
                for _ in range(args.steps):
                    record = trainer.train_step()
                dist.barrier()
                entry = results[f"{layout}/{mode}"]
                entry["step_s"].append((time.perf_counter() - started) / args.steps)
                entry["bytes"] = record["cross_stage_bytes"]
    dist.destroy_process_group()
    return results  # every rank's seconds are the slowest rank's (all-reduced); rank 0's are reported


def run(args) -> dict:
    return run_ranks(_rank_main, WORLD, (args, ), timeout=None)[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--transfer-mib", type=lambda text: [int(v) for v in text.split(",")], default=[1, 16, 64],
                        help="activation sizes of the transfer measurement, MiB (default 1,16,64)")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    result = run(args)
    activation = args.micro_batch_size * args.seq_len * args.hidden * 4
    print("2 stages, TP 2 -> TP 2, 4 local processes, fp32, one thread each")
    for layout, backends in LAYOUTS.items():
        full, sliced = result[f"{layout}/full"], result[f"{layout}/sliced"]
        print(f"\n{layout}: inside stages {backends['stage_backend']}, across stages {backends['p2p_backend']}")
        print(f"  {'transfer':<24} {'full us':>9} {'sliced us':>10} {'bytes full':>12} {'bytes sliced':>13} "
              f"{'time sliced/full':>17}")
        for mib in args.transfer_mib:
            f, q = full["transfers"][str(mib)], sliced["transfers"][str(mib)]
            tf, tq = statistics.median(f["seconds"]), statistics.median(q["seconds"])
            print(
                f"  {f'{mib} MiB activation':<24} {tf * 1e6:9.0f} {tq * 1e6:10.0f} {f['bytes']:>12,} {q['bytes']:>13,} "
                f"{tq / tf:17.3f}")
        step_ratios = sorted(q / f for q, f in zip(sliced["step_s"], full["step_s"]))
        print(f"  training step (hidden {args.hidden}, {args.micro_batches} micro-batches of {args.micro_batch_size} x "
              f"{args.seq_len} tokens, {activation:,}-byte activations): full {min(full['step_s']) * 1e3:.1f} ms, "
              f"sliced {min(sliced['step_s']) * 1e3:.1f} ms; bytes across per step {full['bytes']:,} vs "
              f"{sliced['bytes']:,}; time sliced/full {min(sliced['step_s']) / min(full['step_s']):.3f} (best rounds), "
              f"{step_ratios[len(step_ratios) // 2]:.3f} (median of per-round ratios)")
    print()
    for layout in LAYOUTS:
        full, sliced = result[f"{layout}/full"], result[f"{layout}/sliced"]
        fewer = sliced["bytes"] < full["bytes"]
        largest = str(max(args.transfer_mib))
        ratio = (statistics.median(sliced["transfers"][largest]["seconds"]) /
                 statistics.median(full["transfers"][largest]["seconds"]))
        step_ratios = sorted(q / f for q, f in zip(sliced["step_s"], full["step_s"]))
        step = step_ratios[len(step_ratios) // 2]
        print(f"{layout}: {'PASS' if fewer else 'FAIL'} fewer bytes across stages; "
              f"{'PASS' if ratio <= 1 else 'FAIL'} not slower moving a {largest} MiB activation ({ratio:.3f}); "
              f"{'PASS' if step <= 1 else 'FAIL'} not slower per training step ({step:.3f}, median ratio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
