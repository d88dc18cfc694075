"""Send/recv + all-gather (SR&AG, "sliced") resharding against sending full tensors, on a pipeline of
two stages with TP 2 each (four local processes, one thread per rank).

    .venv/bin/python benchmarks/bench_resharding.py [--rounds 7] [--steps 3] [--transfers 200]

Two link layouts, both modes each, all in the same processes:
  uniform   every group on gloo over 127.0.0.1: the stage boundary is no slower than the link inside
            a stage, so SR&AG can only pay for its extra all-gather;
  topology  TP/DP groups inside a stage on dicomm (shared memory: the fast intra-node fabric of one
            chip type's server) and the stage boundary on gloo TCP (the network between servers),
            the situation SR&AG is for (H2 paper, section 5 and Figure 10).
Two measurements:
  transfer  one micro-batch's activation moved across the boundary and reassembled on every
            receiver, --transfers times after a barrier each; the median over transfers of the
            slowest rank's time;
  step      a whole optimizer step of the pipeline (1f1b, 4 micro-batches), alternating rounds;
            best round of each mode and the median of the per-round ratios.
Bytes are those counted by HeteroPP's P2P layer: everything sent across the stage boundary.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
MODES = ("full", "sliced")
LAYOUTS = {"uniform": {"p2p_backend": "gloo", "stage_backend": "gloo"},
           "topology": {"p2p_backend": "gloo", "stage_backend": "dicomm"}}


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


def time_transfers(trainer, transfers: int) -> tuple[list[float], int]:
    """Per transfer, the slowest rank's seconds to move one activation across the boundary."""
    resharder, shape = trainer.resharder, trainer.executor.activation_shape
    activation = torch.randn(shape)
    sending = trainer.place.stage == 0
    bytes_before = resharder.p2p.bytes_sent
    seconds = torch.zeros(transfers, dtype=torch.float64)
    for i in range(transfers + 5):
        dist.barrier(group=trainer.groups.everyone)
        started = time.perf_counter()
        if sending:
            resharder.send(activation, 1, micro_batch=0)
            resharder.p2p.wait_sends()
        else:
            resharder.post_recv(shape, activation.dtype, 0, micro_batch=0).wait()
        if i >= 5:
            seconds[i - 5] = time.perf_counter() - started
    sent = torch.tensor([float(resharder.p2p.bytes_sent - bytes_before)], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=trainer.groups.everyone)
    dist.all_reduce(sent, group=trainer.groups.everyone)
    return seconds.tolist(), int(sent.item()) // (transfers + 5)


def _rank_main(rank: int, port: int, args, out_path: str) -> None:
    import dicomm  # noqa: F401  (registers the backend)
    from h2.train import TrainConfig
    from heteropp.auto.strategy import strategy_from_mapping
    from heteropp.trainer import PipelineOptions, PipelineTrainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    strategy = strategy_from_mapping(strategy_data(args), "benchmark strategy")
    config = TrainConfig(steps=10**6)
    results = {}
    for layout, backends in LAYOUTS.items():
        trainers = {mode: PipelineTrainer(strategy, config, None, PipelineOptions(resharding=mode, **backends))
                    for mode in MODES}
        for mode, trainer in trainers.items():
            seconds, nbytes = time_transfers(trainer, args.transfers)
            results[f"{layout}/{mode}"] = {"transfer_s": seconds, "transfer_bytes": nbytes, "step_s": [], "bytes": 0}
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
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(results, handle)
    dist.destroy_process_group()


def run(args) -> dict:
    out_path = os.path.join(tempfile.mkdtemp(prefix="bench-reshard-"), "result.json")
    mp.start_processes(_rank_main, args=(_free_port(), args, out_path), nprocs=WORLD, join=True,
                       start_method="spawn")
    with open(out_path) as handle:
        return json.load(handle)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--transfers", type=int, default=200)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args(argv)
    result = run(args)
    activation = args.micro_batch_size * args.seq_len * args.hidden * 4
    print(f"2 stages, TP 2 -> TP 2, hidden {args.hidden}, {args.micro_batches} micro-batches of "
          f"{args.micro_batch_size} x {args.seq_len} tokens (activation {activation:,} bytes), fp32")
    for layout in LAYOUTS:
        full, sliced = result[f"{layout}/full"], result[f"{layout}/sliced"]
        backends = LAYOUTS[layout]
        print(f"\n{layout}: inside stages {backends['stage_backend']}, across stages {backends['p2p_backend']}")
        for name, entry in (("full tensors", full), ("SR&AG sliced", sliced)):
            print(f"  {name:<13} transfer {statistics.median(entry['transfer_s']) * 1e6:8.0f} us "
                  f"({entry['transfer_bytes']:>10,} bytes across)   step {min(entry['step_s']) * 1e3:7.1f} ms "
                  f"({entry['bytes']:>11,} bytes across)")
        transfer_ratio = statistics.median(sliced["transfer_s"]) / statistics.median(full["transfer_s"])
        step_ratios = sorted(s / f for s, f in zip(sliced["step_s"], full["step_s"]))
        print(f"  ratio sliced / full: bytes {sliced['bytes'] / full['bytes']:.3f}, transfer time {transfer_ratio:.3f}, "
              f"step time {min(sliced['step_s']) / min(full['step_s']):.3f} (best rounds), "
              f"{step_ratios[len(step_ratios) // 2]:.3f} (median of per-round ratios)")
    topology = (result["topology/sliced"], result["topology/full"])
    fewer_bytes = topology[0]["bytes"] < topology[1]["bytes"]
    transfer_ratio = statistics.median(topology[0]["transfer_s"]) / statistics.median(topology[1]["transfer_s"])
    print(f"\n{'PASS' if fewer_bytes else 'FAIL'} SR&AG moves fewer bytes across stages than full tensors")
    print(f"{'PASS' if transfer_ratio <= 1 else 'FAIL'} SR&AG is not slower where the boundary is the slow link "
          f"(topology layout, transfer time ratio {transfer_ratio:.3f}, target <= 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
