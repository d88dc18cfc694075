"""Endpoint behaviour that two endpoints in one process can show (setup runs in two threads), and the
in-process round-trip microbenchmark (pytest-benchmark: run once here; timed with
python -m pytest tests/dicomm -k benchmark --benchmark-enable)."""
import tempfile
import threading

import numpy as np
import pytest

import dicomm


@pytest.fixture(params=["shm", "tcp"])
def pair(request):
    store = dicomm.FileStore(tempfile.mkdtemp())
    endpoints = [None, None]

    def connect(rank):
        endpoints[rank] = dicomm.Endpoint(store, rank, 2, transport=request.param, timeout=30)

    threads = [threading.Thread(target=connect, args=(r, )) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    yield endpoints
    for e in endpoints:
        e.close()


def test_wait_with_a_timeout_raises_timeout_error_and_leaves_the_request_pending(pair):
    a, b = pair
    handle = a.irecv(bytearray(4), 1, tag=9)
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.05)
    assert not handle.done
    b.send(b"late", 0, tag=9)
    assert handle.wait() == 4


def test_test_reports_completion_without_blocking(pair):
    a, b = pair
    buffer = np.zeros(16, np.uint8)
    handle = a.irecv(buffer, 1)
    assert handle.test() is False
    b.send(np.full(16, 3, np.uint8), 0)
    while not handle.test():
        pass
    assert handle.succeeded and handle.nbytes == 16 and (buffer == 3).all()


def test_close_fails_pending_requests_with_endpoint_closed(pair):
    a, _ = pair
    handle = a.irecv(bytearray(8), 1)
    a.close()
    with pytest.raises(dicomm.CommError, match="endpoint closed"):
        handle.wait()
    with pytest.raises(dicomm.CommError, match="closed endpoint"):
        a.isend(b"x", 1)


def test_an_address_and_size_tuple_is_a_buffer(pair):
    a, b = pair
    source, target = np.arange(100, dtype=np.uint8), np.zeros(100, np.uint8)
    handle = b.irecv((target.ctypes.data, target.nbytes), 0)
    a.send((source.ctypes.data, source.nbytes), 1)
    handle.wait()
    assert (target == source).all()


def test_a_read_only_receive_buffer_is_refused(pair):
    a, _ = pair
    with pytest.raises(TypeError, match="writable"):
        a.irecv(b"immutable", 1)


def test_benchmark_round_trip_4kib(benchmark, pair):
    ping, pong = pair
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
