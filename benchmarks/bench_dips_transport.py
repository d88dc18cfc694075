"""Di-PS's data flow (ZeroMQ, h2.ps.datapath) against gRPC moving the same bytes, at 1, 16 and 64 MiB.

    python benchmarks/bench_dips_transport.py [--sizes 1,16,64] [--repeats 5]

Both sides run in this process over loopback. ZeroMQ: one push of a layer of that size to a real
`LayerServer` over CURVE (encrypted and authenticated, as Di-PS runs it), which copies it into its staging
buffer and acknowledges. gRPC: one unary call (plaintext, unsigned) carrying
the same bytes to a generic handler that copies them into a buffer and answers a few bytes. The
median of `repeats` transfers each; printed side by side with their ratio (the paper measured ZeroMQ
1.74x faster than gRPC on a 25 Gbps network; loopback on a shared 2-core machine is another world).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import torch
import zmq

from h2.ps.datapath import CurveClient, CurveServer, LayerServer, Route, push_layers
from h2.ps.layout import Layer

MiB = 1 << 20


def zeromq_seconds(nbytes: int, repeats: int) -> float:
    layer = Layer("blob", (("blob", (nbytes // 4, )), ))
    staging = np.empty(nbytes // 4, dtype=np.float32)

    def on_push(ticket, name, payload, sender):
        staging[:] = np.frombuffer(payload, dtype=np.float32)

    server_public, server_secret = zmq.curve_keypair()
    client = CurveClient(*zmq.curve_keypair())
    curve = CurveServer(server_public, server_secret, {client.public: "cluster/bench"})
    server = LayerServer("127.0.0.1", 0, {0: layer}, on_push=on_push, on_pull=lambda name, version: (0, None),
                         curve=curve)
    route = Route(0, layer, f"tcp://127.0.0.1:{server.port}", server_public)
    tensors = {"blob": torch.ones(nbytes // 4)}
    try:
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            push_layers([route], 1, tensors, curve=client)
            times.append(time.perf_counter() - started)
        return statistics.median(times[1:])
    finally:
        server.close()


def grpc_seconds(nbytes: int, repeats: int) -> float:
    staging = bytearray(nbytes)

    def handle(request: bytes, context) -> bytes:
        staging[:] = request
        return b"ok"

    options = [("grpc.max_receive_message_length", nbytes + MiB), ("grpc.max_send_message_length", nbytes + MiB)]
    server = grpc.server(ThreadPoolExecutor(max_workers=2), options=options)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Blob", {"Push": grpc.unary_unary_rpc_method_handler(handle)}), ))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    push = channel.unary_unary("/bench.Blob/Push")
    payload = torch.ones(nbytes // 4).numpy().tobytes()
    try:
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            push(payload, timeout=120)
            times.append(time.perf_counter() - started)
        return statistics.median(times[1:])
    finally:
        channel.close()
        server.stop(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16,64", help="MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"loopback, median of {args.repeats}; load {os.getloadavg()[0]:.2f}")
    print(f"{'size':>8}{'ZeroMQ s':>11}{'MiB/s':>9}{'gRPC s':>10}{'MiB/s':>9}{'ZeroMQ/gRPC':>13}")
    for size in (int(s) for s in args.sizes.split(",")):
        zmq_s, grpc_s = zeromq_seconds(size * MiB, args.repeats), grpc_seconds(size * MiB, args.repeats)
        print(
            f"{size:>5} MiB{zmq_s:>11.4f}{size / zmq_s:>9.0f}{grpc_s:>10.4f}{size / grpc_s:>9.0f}"
            f"{grpc_s / zmq_s:>12.2f}x", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
