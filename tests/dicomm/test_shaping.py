"""DiComm's shaping layer: an emulated link (bandwidth, one-way latency) on what a rank sends, under
tcp and shm alike (two endpoints in one process; setup runs in two threads)."""
import math
import random
import tempfile
import threading
import time

import numpy as np
import pytest

import dicomm
from dicomm import _dicomm_core
from h2.core.links import ArrivalClock, Link


def connect_pair(transport: str, **options) -> list:
    store = dicomm.FileStore(tempfile.mkdtemp())
    endpoints, errors = [None, None], []

    def connect(rank):
        try:
            endpoints[rank] = dicomm.Endpoint(store, rank, 2, transport=transport, timeout=30, connect_timeout=30,
                                              **options)
        except Exception as error:  # raised in the test's thread below
            errors.append(error)

    threads = [threading.Thread(target=connect, args=(r, )) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for e in endpoints:
            if e is not None:
                e.close()
        raise errors[0]
    return endpoints


@pytest.fixture(params=["shm", "tcp"])
def transport(request):
    return request.param


@pytest.fixture
def shaped(transport):
    made = []

    def make(link: Link, **options):
        made.extend(connect_pair(transport, link=link, **options))
        return made[-2:]

    yield make
    for endpoint in made:
        endpoint.close()


def test_the_shaping_layer_applies_the_same_arrival_rule_as_h2_core_links():
    rng = random.Random(7)
    link = Link(bandwidth_gbps=0.5, latency_us=300)
    posts, now = [], 0.0
    for _ in range(200):
        now += rng.choice([0.0, 1e-5, 1e-3, 5e-3])
        posts.append((now, rng.choice([0, 1, 4096, 1 << 20])))
    clock = ArrivalClock(link)
    expected = [clock.arrival(t, n) for t, n in posts]
    measured = _dicomm_core.arrival_times(_dicomm_core.LinkShape(link.bytes_per_s, link.latency_s), posts)
    assert measured == pytest.approx(expected, abs=1e-8)


def test_a_shaped_message_arrives_no_sooner_than_latency_plus_bytes_over_bandwidth(shaped):
    link = Link(bandwidth_gbps=0.1, latency_us=20_000)
    a, b = shaped(link)
    message = np.ones(2_000_000, np.uint8)
    buffer = np.zeros_like(message)
    receive = b.irecv(buffer, 0, tag=1)
    started = time.perf_counter()
    a.isend(message, 1, tag=1)
    receive.wait()
    assert time.perf_counter() - started >= link.seconds(message.nbytes)
    assert (buffer == message).all()


def test_the_sender_never_waits_so_many_messages_are_in_flight_at_once(shaped):
    link = Link(bandwidth_gbps=1.0, latency_us=300_000)
    a, b = shaped(link)
    receives = [b.irecv(bytearray(8), 0, tag=2) for _ in range(10)]
    started = time.perf_counter()
    sends = [a.isend(b"12345678", 1, tag=2) for _ in range(10)]
    posting_s = time.perf_counter() - started
    for receive in receives:
        receive.wait()
    all_arrived_s = time.perf_counter() - started
    assert posting_s < link.latency_s / 2  # isend returned at once
    assert all_arrived_s < 3 * link.latency_s  # one latency for all ten, not ten in a row
    assert all(send.wait() == 8 for send in sends)


def test_receives_and_the_reverse_direction_are_shaped_by_the_peers_own_link(transport):
    a, b = connect_pair(transport, peer_links={1: Link(0.01, 200_000)})  # only rank 0's sends to rank 1
    try:
        assert (a.link(1), b.link(0)) == (Link(0.01, 200_000), None)
        started = time.perf_counter()
        receive = a.irecv(bytearray(4), 1, tag=3)
        b.send(b"fast", 0, tag=3)
        receive.wait()
        assert time.perf_counter() - started < 0.2  # b -> a is not shaped
    finally:
        a.close()
        b.close()


def test_sends_still_held_by_the_link_fail_with_endpoint_closed_on_close(shaped):
    a, _ = shaped(Link(bandwidth_gbps=1.0, latency_us=10_000_000))
    send = a.isend(b"late", 1, tag=4)
    a.close()
    with pytest.raises(dicomm.CommError, match="endpoint closed"):
        send.wait(timeout=5)


@pytest.mark.parametrize("links, error", [
    pytest.param({"link": Link(-1.0, 10)}, "link: bandwidth must be positive", id="negative_bandwidth"),
    pytest.param({"link": Link(0.0, 10)}, "link: bandwidth must be positive", id="zero_bandwidth"),
    pytest.param({"peer_links": {1: Link(1.0, -5)}}, "link to peer 1: latency must not be negative",
                 id="negative_latency_names_the_peer"),
    pytest.param({"link": Link(1.0, math.nan)}, "link: latency must not be negative", id="nan_latency"),
])
def test_a_bad_link_is_refused_before_connecting(links, error):
    with pytest.raises(ValueError, match=error):
        dicomm.Endpoint(dicomm.FileStore(tempfile.mkdtemp()), 0, 2, transport="tcp", connect_timeout=1, **links)


@pytest.mark.parametrize("name, value", [("DICOMM_LINK_GBPS", "-2"), ("DICOMM_LINK_GBPS", "fast"),
                                         ("DICOMM_LINK_LATENCY_US", "-1")])
def test_a_bad_link_variable_is_refused_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}={value} is not a"):
        dicomm.Endpoint(dicomm.FileStore(tempfile.mkdtemp()), 0, 2, transport="tcp", connect_timeout=1)


def test_the_link_variables_shape_every_peer(monkeypatch):
    monkeypatch.setenv("DICOMM_LINK_GBPS", "0.25")
    monkeypatch.setenv("DICOMM_LINK_LATENCY_US", "1500")
    a, b = connect_pair("tcp")
    try:
        assert (a.link(1), b.link(0)) == (Link(0.25, 1500), Link(0.25, 1500))
    finally:
        a.close()
        b.close()
