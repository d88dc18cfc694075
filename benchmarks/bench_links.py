"""Link emulation: does a shaped link deliver its configured bandwidth and latency?

    .venv/bin/python benchmarks/bench_links.py [--pairs 1:20,0.1:1000,0.01:20000] [--paths tcp,shm,gloo]
                                               [--seconds 0.5] [--json FILE]

`--pairs` lists links as GB/s:microseconds. Paths: DiComm's tcp and shm transports under its shaping
layer (dicomm.Endpoint(link=...)), and gloo sends paced by HeteroPP's P2P layer (heteropp.p2p).
Two local processes per path; for each link, and unshaped (the baseline: what the host path itself
takes, measured in the same run):
  latency    half the median round trip of an 8-byte ping-pong (both directions cross the link);
  bandwidth  K messages of S bytes sent back to back, S chosen so one takes 10 ms on the link;
             S over the slope of a least-squares line through the arrival times (each message's
             arrival against its index: a late first or last arrival moves it less than it moves
             the first-to-last span).
Prints configured, measured and their ratio, and PASS where the ratio is within 10%. The shaping
layers pace on top of the host path, whose own latency adds to the configured one (the baseline
column shows how much).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time

from h2.core.links import Link
from h2.core.ranks import run_ranks

PATHS = ("tcp", "shm", "gloo")
DEFAULT_PAIRS = "1:20,0.1:1000,0.01:20000"
PING_BYTES = 8
MESSAGE_SECONDS = 0.010  # one bandwidth message takes this long on the shaped link
BASELINE_MESSAGE_BYTES = 4 << 20
TOLERANCE = 0.10


def parse_pairs(text: str) -> list[Link]:
    links = []
    for item in text.split(","):
        try:
            gbps, latency_us = (float(part) for part in item.split(":"))
        except ValueError:
            raise SystemExit(f"bench_links: --pairs: expected GB/s:microseconds, got {item!r}") from None
        if not (gbps > 0 and latency_us >= 0):
            raise SystemExit(f"bench_links: --pairs: {item!r} needs a positive bandwidth and a latency >= 0")
        links.append(Link(gbps, latency_us))
    return links


def plan(link: Link | None, seconds: float) -> dict:
    """Round trips, message size and count for one measurement lasting about `seconds` each."""
    if link is None:
        return {"rounds": 500, "message_bytes": BASELINE_MESSAGE_BYTES, "messages": 40}
    round_trip = 2 * link.seconds(PING_BYTES)
    message_bytes = max(4096, int(link.bytes_per_s * MESSAGE_SECONDS))
    return {
        "rounds": int(min(500, max(20, seconds / max(round_trip, 1e-5)))), "message_bytes": message_bytes,
        "messages": int(max(10, seconds / MESSAGE_SECONDS))
    }


# ---- one path's two ranks -----------------------------------------------------------------------
class DiCommPath:

    def __init__(self, rank: int, store_dir: str, transport: str, link: Link | None, index: int):
        import dicomm
        self.endpoint = dicomm.Endpoint(dicomm.FileStore(store_dir), rank, 2, transport=transport, link=link,
                                        prefix=f"link{index}", timeout=300)
        self.peer = 1 - rank

    def isend(self, buffer, tag: int):
        return self.endpoint.isend(buffer, self.peer, tag)

    def irecv(self, buffer, tag: int):
        return self.endpoint.irecv(buffer, self.peer, tag)

    def buffer(self, nbytes: int):
        import numpy as np
        return np.zeros(nbytes, np.uint8)

    def close(self):
        self.endpoint.close()


class GlooP2PPath:

    def __init__(self, rank: int, link: Link | None):
        from heteropp.p2p import P2P
        self.p2p = P2P(link_to=(lambda peer: link) if link is not None else None)
        self.peer = 1 - rank

    def isend(self, buffer, tag: int):
        self.p2p.send(buffer, self.peer, None, tag)
        return None

    def irecv(self, buffer, tag: int):
        return self.p2p.recv(buffer, self.peer, None, tag)

    def buffer(self, nbytes: int):
        import torch
        return torch.zeros(nbytes, dtype=torch.uint8)

    def close(self):
        self.p2p.wait_sends()


def latency_s(path, rank: int, rounds: int) -> float:
    """Half the median round trip of a PING_BYTES ping-pong, as rank 0 sees it."""
    ping, pong = path.buffer(PING_BYTES), path.buffer(PING_BYTES)
    sends, round_trips = [], []
    for i in range(rounds + 3):
        started = time.perf_counter()
        if rank == 0:
            sends.append(path.isend(ping, tag=1))
            path.irecv(pong, tag=2).wait()
            if i >= 3:
                round_trips.append(time.perf_counter() - started)
        else:
            path.irecv(pong, tag=1).wait()
            sends.append(path.isend(ping, tag=2))
    for send in sends:
        if send is not None:
            send.wait()
    return statistics.median(round_trips) / 2 if rank == 0 else math.nan


def bandwidth_bytes_per_s(path, rank: int, message_bytes: int, messages: int, window: int = 4) -> float:
    """Rank 0 sends `messages` back to back; rank 1 fits a line through their arrival times."""
    if rank == 0:
        message = path.buffer(message_bytes)
        sends = [path.isend(message, tag=3) for _ in range(messages)]
        for send in sends:
            if send is not None:
                send.wait()
        path.irecv(path.buffer(1), tag=4).wait()
        return math.nan
    buffers = [path.buffer(message_bytes) for _ in range(window)]
    posted = [path.irecv(buffers[i], tag=3) for i in range(min(window, messages))]
    arrivals = []
    for i in range(messages):
        posted[i].wait()
        arrivals.append(time.perf_counter())
        if i + window < messages:
            posted.append(path.irecv(buffers[(i + window) % window], tag=3))
    done = path.isend(path.buffer(1), tag=4)
    if done is not None:
        done.wait()
    return message_bytes / statistics.linear_regression(range(messages), arrivals).slope


def _measure_path(rank: int, world_size: int, path_name: str, links: list, seconds: float, store_dir: str) -> list:
    """Every link of `links` (None: unshaped) on one path; rank 0 reports latency, rank 1 bandwidth."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if path_name == "gloo":
        dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    results = []
    for index, link in enumerate(links):
        path = (GlooP2PPath(rank, link) if path_name == "gloo" else DiCommPath(rank, store_dir, path_name, link, index))
        shape = plan(link, seconds)
        one_way = latency_s(path, rank, shape["rounds"])
        bandwidth = bandwidth_bytes_per_s(path, rank, shape["message_bytes"], shape["messages"])
        path.close()
        results.append({"latency_s": one_way, "bandwidth_bytes_per_s": bandwidth, **shape})
    if path_name == "gloo":
        dist.destroy_process_group()
    return results


def measure(path_name: str, links: list, seconds: float) -> list[dict]:
    ranks = run_ranks(_measure_path, 2, (path_name, links, seconds, tempfile.mkdtemp(prefix="bench-links-")),
                      timeout=1800, start_method="forkserver", preload=["torch", "dicomm", "heteropp.p2p"])
    return [{
        "latency_s": a["latency_s"], "bandwidth_bytes_per_s": b["bandwidth_bytes_per_s"],
        "message_bytes": a["message_bytes"], "messages": a["messages"], "rounds": a["rounds"]
    } for a, b in zip(*ranks)]


# ---- report -------------------------------------------------------------------------------------
def report(rows: list[dict]) -> list[str]:
    lines = [
        f"{'path':<5} {'link':<22} {'latency us: configured':>22} {'measured':>10} {'ratio':>6}   "
        f"{'bandwidth GB/s: configured':>26} {'measured':>9} {'ratio':>6}   {'host path alone':>26}"
    ]
    for row in rows:
        link, base = row["link"], row["baseline"]
        latency_ratio = row["latency_s"] / link.latency_s if link.latency_s else math.nan
        bandwidth_ratio = row["bandwidth_bytes_per_s"] / link.bytes_per_s
        row["latency_ratio"], row["bandwidth_ratio"] = latency_ratio, bandwidth_ratio
        lines.append(f"{row['path']:<5} {link.describe():<22} {link.latency_us:>22.1f} {row['latency_s'] * 1e6:>10.1f} "
                     f"{latency_ratio:>6.3f}   {link.bandwidth_gbps:>26.4g} {row['bandwidth_bytes_per_s'] / 1e9:>9.4f} "
                     f"{bandwidth_ratio:>6.3f}   {base['latency_s'] * 1e6:>9.1f} us, "
                     f"{base['bandwidth_bytes_per_s'] / 1e9:>6.3f} GB/s")
    lines.append("")
    for row in rows:
        for what in ("latency", "bandwidth"):
            ratio = row[f"{what}_ratio"]
            verdict = "PASS" if abs(ratio - 1) <= TOLERANCE else "FAIL"
            lines.append(
                f"{verdict} {row['path']} {row['link'].describe()}: {what} measured / configured = {ratio:.3f} "
                f"(within {TOLERANCE:.0%})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default=DEFAULT_PAIRS,
                        help=f"links as GB/s:us, comma-separated (default {DEFAULT_PAIRS})")
    parser.add_argument("--paths", default=",".join(PATHS), help="tcp, shm, gloo (default all)")
    parser.add_argument("--seconds", type=float, default=0.5, help="about how long each measurement runs")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    links = parse_pairs(args.pairs)
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        raise SystemExit(f"bench_links: --paths: unknown path '{unknown[0]}' (known: {', '.join(PATHS)})")
    print(f"load before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    rows = []
    for path in paths:
        print(f"measuring {path}: unshaped, then {len(links)} links ...", file=sys.stderr, flush=True)
        baseline, *shaped = measure(path, [None, *links], args.seconds)
        rows += [{"path": path, "link": link, "baseline": baseline, **result} for link, result in zip(links, shaped)]
    print("\n".join(report(rows)))
    print(f"load after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                [{**row, "link": {"bandwidth_gbps": row["link"].bandwidth_gbps, "latency_us": row["link"].latency_us}}
                 for row in rows], handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
