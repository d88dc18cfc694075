"""JEEVES across two sites at the paper's setup (configs/xdc/gpt3-175b.yaml), simulated: iteration time
of 1F1B, JEEVES and one site against the cross-site latency (1-40 ms) and against the activation
memory (k = 2-16 micro-batches of a uniform stage, at 20 ms). Prints both tables and, given --out-dir,
writes the two plots there (xdc-latency-sweep.png, xdc-memory-sweep.png; the ones in docs/figures came
from `--out-dir docs/figures`). Without --out-dir nothing is written: the tracked figures change only
when asked.

    .venv/bin/python benchmarks/bench_cross_site_sweeps.py [--scenario FILE] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from heteroauto.cross_site import compare, load_scenario  # noqa: E402

LATENCIES_MS = (1, 2, 5, 10, 20, 30, 40)
LIMITS = (2, 4, 6, 8, 10, 12, 14, 16)


def _row(label, report) -> str:
    f, j, o = report.one_f_one_b, report.jeeves, report.one_site
    fits = "" if f.fits else " (1f1b does not fit)"
    return (f"{label:>8} {f.iteration_s:8.3f} {j.iteration_s:8.3f} {o.iteration_s:8.3f} "
            f"{f.iteration_s / j.iteration_s:6.2f}x "
            f"{j.iteration_s / o.iteration_s:6.3f}x {j.bounds.bound_s:8.3f}  {list(j.layers)}{fits}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="configs/xdc/gpt3-175b.yaml")
    parser.add_argument("--out-dir", help="write the two plots into this folder (default: print the tables only)")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario)
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
    header = (f"{'':>8} {'1f1b s':>8} {'jeeves s':>8} {'1 site s':>8} {'1f1b/jv':>7} {'jv/site':>7} {'bound s':>8}  "
              "jeeves layers")
    started = time.perf_counter()

    print(f"latency sweep ({scenario.links.inter_site.bandwidth_gbps:g} GB/s cross-site link, simulated)\n{header}")
    by_latency = []
    for latency in LATENCIES_MS:
        report = compare(scenario.with_link(latency_ms=latency))
        by_latency.append(report)
        print(_row(f"{latency} ms", report), flush=True)
    print(f"\nmemory sweep (20 ms, k = micro-batches a uniform stage's activation budget holds, simulated)\n{header}")
    by_limit = []
    for k in LIMITS:
        report = compare(scenario.with_limit(k).with_link(latency_ms=20))
        by_limit.append(report)
        print(_row(f"k={k}", report), flush=True)
    print(f"\nsimulated in {time.perf_counter() - started:.0f} s")

    def plot(xs, reports, xlabel, path, fits_only_1f1b=False):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ones = [(x, r.one_f_one_b.iteration_s) for x, r in zip(xs, reports) if r.one_f_one_b.fits or not fits_only_1f1b]
        ax.plot(*zip(*ones), "o-",
                label="1F1B (replicas split the link)" + (", where it fits" if fits_only_1f1b else ""))
        ax.plot(xs, [r.jeeves.iteration_s for r in reports], "s-", label="JEEVES")
        ax.plot(xs, [r.one_site.iteration_s
                     for r in reports], "--", label="1F1B, one site" + (" (fits from k = 8)" if fits_only_1f1b else ""))
        ax.plot(xs, [r.jeeves.bounds.bound_s for r in reports], ":", label="critical-path bound (JEEVES' division)")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("iteration time (s, simulated)")
        ax.set_title("GPT-3 175B, 64 x 8 stages x TP8, two sites (simulated)", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}")

    if args.out_dir:
        plot(LATENCIES_MS, by_latency, "cross-site latency (ms)", os.path.join(args.out_dir, "xdc-latency-sweep.png"))
        plot(LIMITS, by_limit, "activation memory: micro-batches of a uniform stage (k), 20 ms",
             os.path.join(args.out_dir, "xdc-memory-sweep.png"), fits_only_1f1b=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
