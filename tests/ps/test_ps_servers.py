"""The master and the shards refuse bad input with one line and keep serving everyone else."""

import json

import grpc
import pytest

from h2.core.errors import UserError
from h2.ps import rpc, wire
from h2.ps.rpc import Rejected
from ps_harness import control_as, credential_of, data_frames, running_ps


@pytest.fixture(scope="module")
def ps(tmp_path_factory):
    with running_ps(tmp_path_factory.mktemp("ps")) as run:
        yield run


def request(ps, address: str, frames: list, timeout_ms: int = 3000):
    """Send `frames` to a shard as cluster "a" (its real CURVE keys) and parse the answer."""
    master = ps[0]
    server_key = next(route["server_key"] for route in master.routes() if route["address"] == address)
    public, secret = credential_of(master, "cluster/a").curve
    return data_frames(address, frames, (server_key.encode(), public, secret), timeout_ms)


def pull_frames(layer: int = 0, version: int = 0) -> list:
    return [wire.Header(wire.PULL, layer, 0, version, 0).pack(), b""]


def layer_zero(ps):
    master, servers, _ = ps
    route = master.routes()[0]
    return route["address"], route["index"]


def test_a_push_from_an_unknown_cluster_is_refused_and_the_shard_keeps_serving(ps):
    address, layer = layer_zero(ps)
    nbytes = ps[0].layers[layer].nbytes
    header, payload = request(ps, address, [wire.Header(wire.PUSH, layer, 12345, 0, nbytes).pack(), b"\0" * nbytes])
    assert header.kind == wire.ERROR and bytes(payload).startswith(b"push from an unknown cluster: ticket 12345")
    assert request(ps, address, pull_frames(layer))[0].kind == wire.DATA


def test_a_truncated_frame_is_refused_and_the_shard_keeps_serving(ps):
    address, layer = layer_zero(ps)
    header, payload = request(ps, address, [wire.Header(wire.PUSH, layer, 1, 0, 4096).pack(), b"\0" * 100])
    assert bytes(payload) == b"truncated or padded frame: header declares 4096 payload bytes, 100 arrived"
    assert request(ps, address, pull_frames(layer))[0].kind == wire.DATA


def test_an_oversized_message_is_dropped_by_the_transport_and_the_shard_keeps_serving(ps):
    address, layer = layer_zero(ps)
    too_big = max(layer.nbytes for layer in ps[0].layers) + 1024
    assert request(ps, address, [wire.Header(wire.PUSH, layer, 1, 0, too_big).pack(), b"\0" * too_big], 1000) is None
    assert request(ps, address, pull_frames(layer))[0].kind == wire.DATA


def test_a_pull_of_a_version_the_shard_does_not_hold_is_refused(ps):
    address, layer = layer_zero(ps)
    header, payload = request(ps, address, pull_frames(layer, version=99))
    assert header.kind == wire.ERROR and b"version 99 of layer" in bytes(payload)


def test_a_join_from_an_unknown_cluster_is_refused_and_the_master_keeps_serving(ps):
    control = control_as(ps[0], "cluster/a")
    with pytest.raises(Rejected, match=r"unknown cluster 'zz' \(test.yaml lists: a, b\)"):
        control.call("Join", cluster="zz")
    assert control.call("Status")["mode"] == "dips"


def test_a_control_request_that_is_not_json_is_refused_by_name(ps):
    channel = grpc.insecure_channel(ps[2])
    metadata, _ = credential_of(ps[0], "cluster/a").signer().sign("Status", b"\xff{")
    with pytest.raises(grpc.RpcError) as error:
        channel.unary_unary(f"/{rpc.SERVICE}/Status")(b"\xff{", timeout=5, metadata=metadata)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "malformed request: not UTF-8 JSON"


def test_a_port_in_use_is_one_line(ps):
    with pytest.raises(UserError, match=rf"^master: cannot listen on 127.0.0.1:{ps[0].port} \(port in use"):
        rpc.serve({}, "127.0.0.1", ps[0].port, what="master", guard=None)


def test_a_control_request_over_4_mib_is_refused_before_it_is_read_and_the_master_keeps_serving(ps):
    control = control_as(ps[0], "cluster/a")
    with pytest.raises(Rejected, match="RESOURCE_EXHAUSTED|larger than max|Received message larger"):
        control.call("Join", cluster="x" * (5 << 20))
    assert control.call("Status")["mode"] == "dips"


def test_a_cluster_joining_again_while_its_session_is_live_drops_the_old_session_by_name(tmp_path):
    with running_ps(tmp_path, clusters=("a", )) as (master, _, _):
        control = control_as(master, "cluster/a")
        first = control.call("Join", cluster="a")["session"]
        control.call("Join", cluster="a")
        with pytest.raises(Rejected, match="is not current"):
            control.call("Beat", cluster="a", session=first)
    log = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    drops = [e for e in log if e["event"] == "drop"]
    assert [(e["cluster"], e["reason"]) for e in drops] == \
        [("a", "joined again while its session was live (a restarted process replaces it)")]


def test_a_shard_registering_again_while_alive_is_logged_lost_by_name(tmp_path):
    with running_ps(tmp_path) as (master, servers, address):
        servers[1]._register()
        assert master.shards[1].alive
    log = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(e["shard"], e["reason"]) for e in log if e["event"] == "shard_lost"] == \
        [(1, "registered again while alive (a restarted process replaces it)")]
