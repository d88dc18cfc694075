"""Data throughput: `h2 data prepare` against the `tokenizers` library's own batch encoding, and the
training loader against what a training step of `small` consumes.

    .venv/bin/python benchmarks/bench_data.py [--megabytes 16] [--vocab-size 8192] [--rounds 2]

The text is the Python standard library's own sources (h2.data's embedded corpus), one jsonl record
per file, written to a temporary folder; a byte-level BPE tokenizer is trained on it with
`h2 tokenizer train`'s function (h2.data.tokenizer.train_bpe).

1. Tokenizing. Baseline: `tokenizers.Tokenizer.encode_batch` of the same texts, already in memory
   (the library's own batch encoding, its parallelism over every CPU). Ours: the whole `h2 data
   prepare` (reading the jsonl, the source fingerprint, tokenizing, writing the shards and the index).
   Rounds alternate (baseline, ours, baseline, ...) so that load from elsewhere hits both alike;
   the best round of each is compared. Target (issue 32): ours >= 0.8x encode_batch's tokens/s. The
   ratio to `encode_batch_fast` (the same without the offsets, a stricter bar) is printed beside it.
2. Loading. One training step of `small` (its preset, micro-batch 8 x its max_seq_len, fp32, CPU) is
   timed (the median of --small-steps after a warm-up step, with 1 and with --threads torch threads,
   the faster counts): the tokens per second training needs.
   The loader (h2.data.load_data on the prepared folder: memory-mapped shards, the seeded window
   order, int64 batches) is timed drawing the same batches for --load-seconds. Target: >= 10x.

Exits 1 when a target is missed. Prints /proc/loadavg before and after: on a shared machine the
numbers move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

PREPARE_TARGET = 0.8
LOADER_TARGET = 10.0


def loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="utf-8") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "unknown"


def write_jsonl(folder: str, megabytes: float) -> tuple[str, list[str]]:
    from h2.data.corpus import _python_sources, sysconfig

    root = sysconfig.get_paths()["stdlib"]
    texts, total = [], 0
    for path in _python_sources(root):
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            texts.append(text)
            total += len(text.encode())
        if total >= megabytes * 2**20:
            break
    path = os.path.join(folder, "stdlib.jsonl")
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}) + "\n")
    return path, texts


def bench_prepare(args, folder: str, data: str, texts: list[str], tokenizer_path: str) -> tuple[float, str]:
    from tokenizers import Tokenizer

    from h2.data.prepare import prepare
    from h2.data.sources import resolve_source

    baseline_rates, our_rates, prepared = [], [], None
    library = Tokenizer.from_file(tokenizer_path)
    calls = [library.encode_batch] + ([library.encode_batch_fast] if hasattr(library, "encode_batch_fast") else [])
    for round_index in range(args.rounds):
        rates = []
        for call in calls:  # the faster of encode_batch and encode_batch_fast (no offsets) is the baseline
            started = time.perf_counter()
            encoded = call(texts, add_special_tokens=False)
            seconds = time.perf_counter() - started
            tokens = sum(len(e.ids) for e in encoded)
            rates.append(tokens / seconds)
            del encoded
        baseline_rates.append(rates)

        prepared = os.path.join(folder, f"prepared-{round_index}")
        started = time.perf_counter()
        index = prepare(resolve_source(data), tokenizer_path, prepared, workers=args.workers, progress=False)
        seconds = time.perf_counter() - started
        our_rates.append((index["tokens"] - index["documents"]) / seconds)  # without the end-of-document tokens
        assert index["tokens"] - index["documents"] == tokens, "prepare and the library disagree on the tokens"
        print(
            f"round {round_index + 1}: tokenizers {' / '.join(c.__name__ for c in calls)} "
            f"{' / '.join(f'{r:,.0f}' for r in rates)} tokens/s, "
            f"h2 data prepare {our_rates[-1]:,.0f} tokens/s ({tokens:,} tokens)", flush=True)
    named = max(rates[0] for rates in baseline_rates)  # encode_batch: the target's baseline
    ratio = max(our_rates) / named
    paired = statistics.median(ours / rates[0] for ours, rates in zip(our_rates, baseline_rates))
    print(f"tokenizing: the median over rounds of each round's ratio (back to back, alike load) is {paired:.2f}x")
    print(f"tokenizing: h2 data prepare {max(our_rates):,.0f} tokens/s vs tokenizers' encode_batch "
          f"{named:,.0f} tokens/s (best of {args.rounds}): {ratio:.2f}x (target >= {PREPARE_TARGET}x)")
    if len(calls) > 1:
        fast = max(rates[1] for rates in baseline_rates)
        print(f"tokenizing: against encode_batch_fast {fast:,.0f} tokens/s (no offsets; not the target): "
              f"{max(our_rates) / fast:.2f}x")
    return ratio, prepared


def small_step_tokens_per_s(args, folder: str) -> tuple[float, int, int]:
    """Tokens/s a step of small consumes, with the faster of 1 and all torch threads (on a loaded
    machine several threads can be many times slower than one): the larger need."""
    import torch

    from h2.core.model_config import preset
    from h2.core.training import TrainConfig
    from h2.train.trainer import Trainer

    small = preset("small")
    config = TrainConfig(steps=args.small_steps + 1, micro_batch_size=8, seq_len=small.max_seq_len, checkpoint_every=0)
    tokens = config.global_batch * config.seq_len
    step_times = {}
    for threads in sorted({1, args.threads}):
        torch.set_num_threads(threads)
        trainer = Trainer(small, config, os.path.join(folder, f"small-run-{threads}"), show_progress=False)
        records = [trainer.train_step() for _ in range(args.small_steps + 1)]
        step_times[threads] = statistics.median(r["step_time_s"] for r in records[1:])
        print(
            f"small: one step of {config.global_batch} x {config.seq_len} tokens takes {step_times[threads]:.3f} s "
            f"(median of {args.small_steps}, {threads} torch thread{'s' if threads > 1 else ''})", flush=True)
    step_s = min(step_times.values())
    print(f"small: training needs {tokens / step_s:,.0f} tokens/s (the faster setting)")
    return tokens / step_s, config.global_batch, config.seq_len


def loader_tokens_per_s(args, prepared: str, global_batch: int, seq_len: int) -> float:
    from h2.data import load_data

    stream = load_data(prepared, seq_len=seq_len, seed=0).train
    stream.next_batch(global_batch)  # warm-up: the first permutation
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.load_seconds:
        batch = stream.next_batch(global_batch)
        batches += 1
    seconds = time.perf_counter() - started
    assert batch.shape == (global_batch, seq_len + 1)
    rate = batches * global_batch * seq_len / seconds
    print(f"loader: {batches:,} batches of {global_batch} x {seq_len} in {seconds:.2f} s: {rate:,.0f} tokens/s")
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=16.0, help="text to tokenize (default 16 MiB)")
    parser.add_argument("--vocab-size", type=int, default=8192, help="the BPE tokenizer's vocabulary")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of baseline and ours")
    parser.add_argument("--workers", type=int, default=None, help="h2 data prepare's processes (default: CPUs)")
    parser.add_argument("--small-steps", type=int, default=3, help="timed steps of small")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for small")
    parser.add_argument("--load-seconds", type=float, default=3.0, help="how long the loader is timed")
    args = parser.parse_args(argv)
    from h2.data.tokenizer import train_bpe

    print(f"load before: {loadavg()} (/proc/loadavg, {os.cpu_count()} CPUs)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_data-") as folder:
        data, texts = write_jsonl(folder, args.megabytes)
        print(f"text: {len(texts):,} standard-library files, {sum(len(t.encode()) for t in texts) / 2**20:.1f} MiB",
              flush=True)
        tokenizer_path = train_bpe(texts[:max(1, len(texts) // 4)], args.vocab_size, os.path.join(folder, "tok"))
        prepare_ratio, prepared = bench_prepare(args, folder, data, texts, tokenizer_path)
        need, global_batch, seq_len = small_step_tokens_per_s(args, folder)
        loader_ratio = loader_tokens_per_s(args, prepared, global_batch, seq_len) / need
        print(f"loading: the loader serves {loader_ratio:,.1f}x what a step of small consumes "
              f"(target >= {LOADER_TARGET:g}x)")
    print(f"load after: {loadavg()}")
    missed = [
        name
        for name, ok in (("tokenizing", prepare_ratio >= PREPARE_TARGET), ("loading", loader_ratio >= LOADER_TARGET))
        if not ok
    ]
    if missed:
        print(f"below target: {', '.join(missed)}")
        return 1
    print("both targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
