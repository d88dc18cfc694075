"""Step time of the h2 tiny model's training step (forward, loss, backward, AdamW update) with no
op tool active, and with each op tool active over every op; prints each time and its ratio to the
plain step, from the same run.

    python benchmarks/op_tools_overhead.py [--device cpu] [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ditorch.op_tools import OpAutoCompare, OpObserve, OpOverflowCheck, OpTimeMeasure
from h2.core.model_config import preset
from h2.model.transformer import Transformer, language_model_loss

TOOLS = {
    "observe": lambda: OpObserve(report=None, keep_records=False),
    "overflow check": lambda: OpOverflowCheck(report=None),
    "time measure": lambda: OpTimeMeasure(report=None),
    "autocompare": lambda: OpAutoCompare(report=None),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration (median reported)")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device.startswith("dipu"):
        import ditorch.dipu  # noqa: F401  registers the device
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = Transformer(preset("tiny")).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 256, (args.micro_batch_size, args.seq_len + 1)).to(device)

    def step() -> float:
        started = time.perf_counter()
        loss = language_model_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        return time.perf_counter() - started

    def timed(make_tool=None) -> float:
        times = []
        for _ in range(args.steps):
            if make_tool is None:
                times.append(step())
            else:
                with make_tool():
                    times.append(step())
        return statistics.median(times)

    for make in (None, *TOOLS.values()):  # first use of a dispatch mode imports torch._dynamo: not timed
        if make is None:
            step()
        else:
            with make():
                step()
    print(f"h2 tiny training step on {device}, batch {args.micro_batch_size} x {args.seq_len}, "
          f"{torch.get_num_threads()} thread(s), median of {args.steps} steps")
    plain = timed()
    print(f"{'no tool (nothing hooked)':<28} {1e3 * plain:>10.1f} ms   1.00x")
    for name, make in TOOLS.items():
        with_tool = timed(make)
        print(f"{name:<28} {1e3 * with_tool:>10.1f} ms {with_tool / plain:>6.1f}x")
    plain_again = timed()
    print(f"{'no tool, again':<28} {1e3 * plain_again:>10.1f} ms {plain_again / plain:>6.2f}x")


if __name__ == "__main__":
    main()
