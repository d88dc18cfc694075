"""pytest-benchmark microbenchmarks of DiComm pieces that run inside one process.

Run with: python -m pytest benchmarks/test_dicomm.py --benchmark-enable
(The two-process comparison against gloo and memcpy is python -m dicomm.bench.)
"""
import tempfile
import threading

import numpy as np
import pytest

import dicomm
from dicomm import _dicomm_core as core

HEADER = core.encode_frame_header("Data", tag=3, seq=9, total_bytes=4096, payload_bytes=4096)


def test_decode_frame_header(benchmark):
    header = benchmark(core.decode_frame_header, HEADER)
    assert header["total_bytes"] == 4096


@pytest.fixture(params=["shm", "tcp"])
def endpoint_pair(request):
    """Ranks 0 and 1 of one job, both in this process (setup runs in two threads)."""
    store = dicomm.FileStore(tempfile.mkdtemp())
    endpoints = [None, None]

    def connect(rank):
        endpoints[rank] = dicomm.Endpoint(store, rank, 2, transport=request.param, timeout=60)

    threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    yield endpoints
    for e in endpoints:
        e.close()


def test_round_trip_4kib(benchmark, endpoint_pair):
    ping, pong = endpoint_pair
    outgoing, incoming, echo = np.ones(4096, np.uint8), np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)

    def round_trip():
        back = ping.irecv(incoming, 1)
        there = pong.irecv(echo, 0)
        ping.send(outgoing, 1)
        there.wait()
        pong.send(echo, 0)
        back.wait()

    benchmark(round_trip)
    assert (incoming == 1).all()
