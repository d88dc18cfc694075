"""Di-PS against synchronous DiLoCo, naive asynchronous DiLoCo and the paper's asynchronous DiLoCo on a
decentralized architecture (mode async-diloco) on 4 emulated clusters.

    python benchmarks/bench_dips.py                       # configs/dips/local-4.yaml, modes sync async dips
    python benchmarks/bench_dips.py --modes sync,dips,async-diloco
    python benchmarks/bench_dips.py --outliers c3         # also: cluster c3 pushes 100x pseudo-gradients
    python benchmarks/bench_dips.py --faults              # also: dips with a cluster, a shard, the master killed
    python benchmarks/bench_dips.py --tokens 900000       # a longer run than the file's budget

Each mode is one `h2 ps launch` of the same run file (same clusters, emulated speeds, token budget),
changing only `mode` (and, with --outliers, the named cluster's fault injection). The global model's
loss over time is the held-out loss each cluster measures on every version it pulls (the same fixed
sample for all), placed at the first moment any cluster held that version. Printed: per mode the
rounds, final loss, time to the target loss and the speedup over sync (the baseline, same run), and
the emulation's honesty (steps whose real compute overran their emulated time). In async-diloco there is
no global model: each cluster scores its own copy after each of its outer steps; its curve is every such
score, and its final loss the mean of the clusters' last scores (each cluster's is printed too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

from h2.core.dips import MODE_RULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


FAULTS = ["--kill", "cluster-c1@r10", "--kill", "shard-1@r20", "--kill", "master@r30", "--shard-crash-at-round", "40"]


def launch(base: dict, mode: str, out: str, outlier: str | None, extra: list[str] = ()) -> dict:
    config = dict(base, mode=mode, out=out)
    if outlier:
        config["clusters"] = [
            dict(c, outlier="scale", outlier_every=2, outlier_scale=100.0) if c["id"] == outlier else c
            for c in base["clusters"]
        ]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(config, handle)
        path = handle.name
    try:
        subprocess.run([sys.executable, "-m", "h2.cli.main", "ps", "launch", "--config", path, "--overwrite", *extra],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.remove(path)
    return measure(base, mode, out)


def measure(base: dict, mode: str, out: str) -> dict:
    """The run's global loss curve from its logs; time 0 is when the last cluster first joined (the
    processes' start-up, torch's import on a busy host, is not part of what is emulated)."""
    events = read_jsonl(os.path.join(out, "rounds.jsonl"))
    first_join: dict[str, float] = {}
    for event in events:
        if event["event"] == "join":
            first_join.setdefault(event["cluster"], event["time"])
    start = max(first_join.values())
    first_seen: dict[int, tuple[float, float]] = {}
    overruns, steps = 0, 0
    for cluster in base["clusters"]:
        syncs = read_jsonl(os.path.join(out, "clusters", cluster["id"], "ps.jsonl"))
        for sync in syncs:
            if sync.get("eval_loss") is not None:
                seen = first_seen.get(sync["version"])
                if seen is None or sync["time"] < seen[0]:
                    first_seen[sync["version"]] = (sync["time"], sync["eval_loss"])
        overruns += syncs[-1]["pacing_overruns"] if syncs else 0
        steps += syncs[-1]["step"] if syncs else 0
    curve = sorted((t - start, loss, version) for version, (t, loss) in first_seen.items())
    cluster_final = last_losses(base, out)
    final_loss = curve[-1][1]
    if MODE_RULES[mode].decentralized:  # no global model: every cluster's own copy, each scored when it changed
        curve = sorted((t - start, loss, version) for t, loss, version in all_scores(base, out))
        final_loss = sum(cluster_final.values()) / len(cluster_final)
    rounds = [e for e in events if e["event"] == "round"]
    return {
        "mode": mode, "curve": curve, "final_loss": final_loss, "final_time_s": curve[-1][0], "rounds": len(rounds),
        "rejected": sum(len(r["rejected"])
                        for r in rounds), "overruns": overruns, "steps": steps, "cluster_final": cluster_final
    }


def all_scores(base: dict, out: str) -> list[tuple[float, float, int]]:
    """(time, held-out loss, version) of every scored model of every cluster."""
    return [(sync["time"], sync["eval_loss"], sync["version"]) for cluster in base["clusters"]
            for sync in read_jsonl(os.path.join(out, "clusters", cluster["id"], "ps.jsonl"))
            if sync.get("eval_loss") is not None]


def last_losses(base: dict, out: str) -> dict[str, float]:
    """Each cluster's last held-out loss (of the global model it last pulled; async-diloco: of its own copy)."""
    losses = {}
    for cluster in base["clusters"]:
        scored = [
            s for s in read_jsonl(os.path.join(out, "clusters", cluster["id"], "ps.jsonl"))
            if s.get("eval_loss") is not None
        ]
        if scored:
            losses[cluster["id"]] = scored[-1]["eval_loss"]
    return losses


def time_to(curve: list, target: float) -> float | None:
    return next((t for t, loss, _ in curve if loss <= target), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "dips", "local-4.yaml"))
    parser.add_argument("--modes", default="sync,async,dips")
    parser.add_argument("--outliers", metavar="CLUSTER", help="also run async and dips with this cluster's outliers")
    parser.add_argument("--faults", action="store_true", help="also run dips with " + " ".join(FAULTS))
    parser.add_argument("--target", type=float, help="target loss (default: sync's final loss)")
    parser.add_argument("--tokens", type=int, help="token budget of every run (default: the run file's)")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_dips"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--report-only", action="store_true", help="no runs: report the runs already in --out")
    args = parser.parse_args()
    with open(args.config, encoding="utf-8") as handle:
        base = yaml.safe_load(handle)
    if args.tokens is not None:
        if args.tokens <= 0:
            parser.error(f"--tokens must be positive, got {args.tokens}")
        base["tokens"] = args.tokens
    print(
        f"{len(base['clusters'])} clusters, emulated step times "
        f"{', '.join(str(c['step_time_s']) for c in base['clusters'])} s, H={base['inner_steps']}, "
        f"{base['tokens']:,} tokens; load {os.getloadavg()[0]:.2f}", flush=True)
    run = launch if not args.report_only else (lambda base, mode, out, *_: measure(base, mode, out))
    results = {}
    for mode in args.modes.split(","):
        results[mode] = run(base, mode, os.path.join(args.out, mode), None)
        r = results[mode]
        print(
            f"  ran {mode}: {r['rounds']} rounds, final loss {r['final_loss']:.4f} at {r['final_time_s']:.1f} s; "
            f"load {os.getloadavg()[0]:.2f}", flush=True)
    if args.outliers:
        for mode in ("async", "dips"):
            key = f"{mode}+outliers"
            results[key] = run(base, mode, os.path.join(args.out, key), args.outliers)
            r = results[key]
            print(
                f"  ran {key}: {r['rounds']} rounds, final loss {r['final_loss']:.4f}, {r['rejected']} rejected; "
                f"load {os.getloadavg()[0]:.2f}", flush=True)
    if args.faults:
        results["dips+faults"] = run(base, "dips", os.path.join(args.out, "dips+faults"), None, FAULTS)
        r = results["dips+faults"]
        print(
            f"  ran dips+faults: {r['rounds']} rounds, final loss {r['final_loss']:.4f}; "
            f"load {os.getloadavg()[0]:.2f}", flush=True)
    baseline = results.get("sync")
    target = args.target or baseline["final_loss"]
    base_time = time_to(baseline["curve"], target) if baseline else None
    print(f"\ntarget held-out loss {target:.4f} (sync's final loss unless --target); "
          f"times from the moment every cluster had joined")
    print(f"{'run':<16}{'rounds':>7}{'final loss':>12}{'vs sync':>9}{'time to target':>16}{'speedup':>9}"
          f"{'rejected':>10}{'overruns':>10}")
    for key, r in results.items():
        reached = time_to(r["curve"], target)
        speedup = f"{base_time / reached:.2f}x" if reached and base_time else "-"
        relative = f"{100 * (r['final_loss'] / baseline['final_loss'] - 1):+.1f}%" if baseline else "-"
        shown = f"{reached:.1f} s" if reached is not None else "not reached"
        print(f"{key:<16}{r['rounds']:>7}{r['final_loss']:>12.4f}{relative:>9}{shown:>16}{speedup:>9}"
              f"{r['rejected']:>10}{r['overruns']:>6}/{r['steps']}")
    for key, r in results.items():
        print(f"{key}: each cluster's last held-out loss: " +
              ", ".join(f"{cid} {loss:.4f}" for cid, loss in r.get("cluster_final", {}).items()))
    if "dips" in results and "dips+faults" in results:
        faulted, clean = results["dips+faults"]["final_loss"], results["dips"]["final_loss"]
        print(f"dips+faults against fault-free dips (same run): final loss {100 * (faulted / clean - 1):+.1f}%")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"target": target, "results": results}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
