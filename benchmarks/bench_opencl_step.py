"""A model preset's training step on the OpenCL vendor against the host vendor, from one run.

    .venv/bin/python benchmarks/bench_opencl_step.py [--preset small] [--batch 2] [--seq 64] [--steps 5] [--warmup 2]

Each vendor trains the preset (AdamW, foreach=False, one random batch) in its own process
(DIPU_VENDOR=host, then opencl): `--warmup` steps left out (kernel compilation, allocator growth),
then the median wall time of `--steps` synchronized steps. Prints both medians, the ratio opencl/host
(> 1: OpenCL slower) and the machine's load before and after. The host vendor runs each operator as the
CPU's own ATen kernel; the OpenCL vendor runs pocl-compiled kernels (CLBlast for GEMMs) on the same
cores, with attention on the CPU fallback.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r"""
import json, statistics, sys, time
import torch
import ditorch.dipu as dipu
from h2.core.model_config import preset
from h2.model import Transformer
from h2.model.transformer import language_model_loss

name, batch, seq, steps, warmup = sys.argv[1], *map(int, sys.argv[2:6])
config = preset(name)
torch.manual_seed(0)
model = Transformer(config).to("dipu")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
tokens = torch.randint(0, config.vocab_size, (batch, seq + 1)).to("dipu")
times = []
for step in range(warmup + steps):
    start = time.perf_counter()
    loss = language_model_loss(model(tokens[:, :-1]), tokens[:, 1:])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.dipu.synchronize()
    if step >= warmup:
        times.append(time.perf_counter() - start)
print(json.dumps({"vendor": dipu.vendor_name(), "median_s": statistics.median(times)}))
"""


def load() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def step_time(vendor: str, args) -> float:
    result = subprocess.run(
        [sys.executable, "-c", WORKER, args.preset,
         str(args.batch),
         str(args.seq),
         str(args.steps),
         str(args.warmup)], capture_output=True, text=True, env={**os.environ, "DIPU_VENDOR": vendor}, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["vendor"] == vendor
    return report["median_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    print(f"preset {args.preset}, batch {args.batch} x {args.seq} tokens; load before {load()}")
    host = step_time("host", args)
    opencl = step_time("opencl", args)
    print(f"step time: host vendor {host:.3f} s, opencl vendor {opencl:.3f} s, ratio opencl/host {opencl / host:.2f}")
    print(f"load after {load()}")


if __name__ == "__main__":
    main()
