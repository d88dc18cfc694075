"""Training-step time of a small LLaMA-shaped model on the CPU and on dipu, from the same run.

    python benchmarks/bench_dipu_step.py [--steps N] [--dim D] [--layers L] [--seq S] [--batch B]

Prints the CPU step time, the dipu step time under the default host profile (host-accessible:
the CPU fallback aliases device memory) and their ratio; then the same for the `discrete` profile
(not host-accessible: every fallback copies through the vendor's memcpy), measured in a child
process because a profile is fixed per process. CPU and dipu steps alternate so that background
load affects both alike; times are medians, of wall-clock time and of the process's CPU time
(the latter is what to trust on a machine shared with other work).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from h2.core.model_config import ModelConfig
from h2.model import Transformer
from h2.model.transformer import language_model_loss


def make_trainer(device: str, cfg: ModelConfig, batch: int, seq: int):
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=generator).to(device)

    def step() -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one training step."""
        wall, cpu = time.perf_counter(), time.process_time()
        loss = language_model_loss(model(tokens[:, :-1]), tokens[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()  # waits for the device
        return time.perf_counter() - wall, time.process_time() - cpu

    return step


def measure(args) -> dict:
    import ditorch.dipu  # noqa: F401  registers dipu with the profile in DIPU_HOST_PROFILE

    cfg = ModelConfig(name="bench", vocab_size=args.vocab, hidden_size=args.dim, num_layers=args.layers,
                      num_heads=args.heads, num_kv_heads=args.heads, intermediate_size=4 * args.dim,
                      max_seq_len=args.seq)
    steps = {device: make_trainer(device, cfg, args.batch, args.seq) for device in ("cpu", "dipu")}
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    times = {device: [] for device in steps}
    for _ in range(args.steps):
        for device, step in steps.items():
            times[device].append(step())
    result = {"profile": os.environ.get("DIPU_HOST_PROFILE", "default")}
    for kind, column in (("wall", 0), ("cputime", 1)):
        cpu = statistics.median(t[column] for t in times["cpu"])
        dipu = statistics.median(t[column] for t in times["dipu"])
        result[kind] = {"cpu_s": cpu, "dipu_s": dipu, "ratio": dipu / cpu}
    return result


def measure_in_child(args, profile: str) -> dict:
    env = {**os.environ, "DIPU_HOST_PROFILE": profile}
    command = [sys.executable, __file__, "--child", *sys.argv[1:]]
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    print(f"model: dim {args.dim}, {args.layers} layers, seq {args.seq}, batch {args.batch}, vocab {args.vocab}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.steps} steps")
    for profile in ("default", "discrete"):
        r = measure_in_child(args, profile)
        access = "host-accessible" if profile == "default" else "not host-accessible"
        for kind in ("wall", "cputime"):
            m = r[kind]
            print(f"{profile:<9} ({access:<19}) {kind:<8} cpu {m['cpu_s'] * 1e3:8.1f} ms   "
                  f"dipu {m['dipu_s'] * 1e3:8.1f} ms"
                  f"   dipu/cpu {m['ratio']:.3f}")


if __name__ == "__main__":
    main()
