"""CPU-tensor work that never names a device, with and without ditorch's mappings, in one process.

The mappings wrap only entry points that take a device (factories, .to, .cuda, autocast, ...), so
plain tensor work must not slow down. Rounds alternate mapped and unmapped to share the machine's
noise; CPU time of this process (one intra-op thread) is measured rather than wall time, so other
processes on a shared machine disturb it less; the median of each is compared.

    python benchmarks/bench_ditorch_overhead.py [--rounds 40] [--steps 10]
"""

import argparse
import statistics
import time

import torch

import ditorch


def cpu_work(model: torch.nn.Module, batch: torch.Tensor, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        batch = batch * 0.5 + torch.tanh(batch).mul(0.5)


def timed(model, batch, steps) -> float:
    started = time.process_time()
    cpu_work(model, batch, steps)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    batch = torch.randn(64, 256)
    vendor = ditorch.vendor()
    if vendor is None:
        raise SystemExit("no vendor is active, nothing is mapped: there is no overhead to measure")
    timed(model, batch, args.steps)  # warm-up
    plain, mapped = [], []
    for _ in range(args.rounds):
        ditorch.deactivate()
        plain.append(timed(model, batch, args.steps))
        ditorch.use(vendor.name)
        mapped.append(timed(model, batch, args.steps))
    baseline, ours = statistics.median(plain), statistics.median(mapped)
    print(f"CPU work, {args.steps} steps x {args.rounds} rounds (median), vendor {vendor.name}")
    print(f"  without mappings {baseline * 1e3:8.2f} ms")
    print(f"  with mappings    {ours * 1e3:8.2f} ms")
    print(f"  ratio            {ours / baseline:8.3f}  (target <= 1.02)")


if __name__ == "__main__":
    main()
