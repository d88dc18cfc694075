"""A foreign local process holding no credential (or another run's) can read nothing and change nothing in a
running Di-PS job; a participant cannot speak for another; claimed tokens are capped; pending tickets are
bounded and expire; a captured call cannot be replayed (issue 34).

The attacker side speaks raw gRPC and raw ZeroMQ, the way a stranger on the network would: it knows the
addresses (ports are not secret) and the wire formats (the code is public), not the run's secret.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
import zmq

from h2.core.model_config import preset
from h2.ps import wire
from h2.ps.client import ClusterClient
from h2.ps.datapath import DataFlowError
from h2.ps.rpc import Control, Rejected
from ps_harness import data_frames, model_tensors, running_ps, sync_together

try:  # a credential of another run: signed, but under a key this run never issued
    from h2.ps.auth import Signer
except ImportError:  # the code before authentication: the wrong credential is no credential
    Signer = None

SERVICE = "h2.ps.Control"
STRANGERS = ["no credential", "another run's credential"]


def stranger_metadata(kind: str, method: str, body: bytes, caller: str) -> list | None:
    if kind == "no credential" or Signer is None:
        return None
    return Signer(caller, secrets.token_bytes(32)).sign(method, body)[0]


def stranger_call(address: str, method: str, request: dict, kind: str = "no credential",
                  caller: str = "cluster/c1") -> tuple[str, dict | None]:
    """(status code name, reply) of a call from a stranger."""
    body = json.dumps(request).encode()
    channel = grpc.insecure_channel(address)
    try:
        raw = channel.unary_unary(f"/{SERVICE}/{method}")(body, timeout=10, metadata=stranger_metadata(
            kind, method, body, caller))
        return "OK", json.loads(raw)
    except grpc.RpcError as error:
        return error.code().name, None
    finally:
        channel.close()


def stranger_frames(address: str, frames: list, curve: tuple[bytes, bytes, bytes] | None = None,
                    timeout_ms: int = 2000):
    """Send frames to a shard's data port; its answer (header, payload), or None if none came."""
    return data_frames(address, frames, curve, timeout_ms)


def events(out) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, "rounds.jsonl")) if line.strip()]


def shard_parameters(servers) -> dict[str, torch.Tensor]:
    return {name: value.clone() for server in servers for name, value in server.state.params.items()}


def unchanged(before: dict, servers) -> bool:
    after = shard_parameters(servers)
    return all(server.state.version == 0
               for server in servers) and all(torch.equal(before[name], after[name]) for name in before)


@pytest.fixture
def job(tmp_path):
    """A tiny running job: two clusters listed, c1 joined (with its real credential)."""
    with running_ps(tmp_path, clusters=("c1", "c2")) as (master, servers, address):
        client = ClusterClient(address, "c1", log=lambda _: None)
        try:
            yield master, servers, address, client, str(tmp_path)
        finally:
            client.close(leave=False)


# ---- the attacks ---------------------------------------------------------------------------------
def test_a_stranger_process_cannot_read_the_runs_status(job):
    master, _, address, client, _ = job
    stranger = ("import grpc, sys\n"
                "channel = grpc.insecure_channel(sys.argv[1])\n"
                "try:\n"
                "    print(channel.unary_unary('/h2.ps.Control/Status')(b'{}', timeout=10).decode())\n"
                "except grpc.RpcError as error:\n"
                "    print('REFUSED', error.code().name)\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("H2_PS")}
    result = subprocess.run([sys.executable, "-c", stranger, address], capture_output=True, text=True, timeout=60,
                            env=env)
    assert result.stdout.strip() == "REFUSED UNAUTHENTICATED", result.stdout + result.stderr
    for kind in STRANGERS:
        assert stranger_call(address, "Status", {}, kind) == ("UNAUTHENTICATED", None), kind
    assert client.master.call("Status")["clusters"]["c1"]["active"]  # a participant still reads it


def test_a_stranger_cannot_pull_the_global_model_from_a_shard(job):
    master, _, _, _, _ = job
    route = master.routes()[0]
    pull = [wire.Header(wire.PULL, route["index"], 0, 0, 0).pack(), b""]
    assert stranger_frames(route["address"], pull) is None  # no CURVE: the handshake never completes
    public, secret = zmq.curve_keypair()  # CURVE, the shard's public key, but keys the run never admitted
    assert stranger_frames(route["address"], pull, (route["server_key"].encode(), public, secret)) is None


def test_a_stranger_cannot_forge_a_pulled_record(job):
    master, _, address, client, out = job
    for kind in STRANGERS:
        code, _ = stranger_call(address, "Pulled", {"cluster": "c1", "version": 0, "pull_s": 123.25, "bytes": 1}, kind)
        assert code == "UNAUTHENTICATED", kind
    with pytest.raises(Rejected, match="not current"):  # c1 itself, without its session
        client.master.call("Pulled", cluster="c1", version=0, pull_s=123.25, bytes=1)
    assert not [e for e in events(out) if e["event"] == "pull" and e["pull_s"] == 123.25]


@pytest.mark.parametrize("kind", STRANGERS)
def test_a_stranger_cannot_join_as_an_existing_cluster(job, kind):
    master, _, address, client, out = job
    code, _ = stranger_call(address, "Join", {"cluster": "c1"}, kind)
    client.master.call("Beat", cluster="c1", session=client.session)  # the real c1's session still stands
    assert [e["cluster"] for e in events(out) if e["event"] in ("join", "drop")] == ["c1"]
    assert code == "UNAUTHENTICATED"


def test_a_cluster_cannot_be_made_to_leave_by_a_stranger_or_by_another_cluster(job):
    master, _, address, client, out = job
    codes = [stranger_call(address, "Leave", {"cluster": "c1"}, kind)[0] for kind in STRANGERS]
    assert master.clusters["c1"].active and codes == ["UNAUTHENTICATED"] * len(STRANGERS)
    other = ClusterClient(address, "c2", log=lambda _: None)
    try:  # c2's credential, even holding c1's session, does not speak for c1
        with pytest.raises(Rejected, match="cluster/c2 cannot speak for cluster 'c1'"):
            other.master.call("Leave", cluster="c1", session=client.session)
    finally:
        other.close(leave=False)
    assert master.clusters["c1"].active
    assert not [e for e in events(out) if e["event"] == "leave"]


def test_a_stranger_can_neither_get_a_push_ticket_nor_push_layers(job):
    master, servers, address, _, _ = job
    before = shard_parameters(servers)
    codes = [stranger_call(address, "RequestPush", {"cluster": "c1", "base_version": 0}, kind)[0] for kind in STRANGERS]
    answers = []
    for route in master.routes():  # zero layers under a made-up ticket, straight to the shards
        nbytes = master.layers[route["index"]].nbytes
        push = [wire.Header(wire.PUSH, route["index"], 1, 0, nbytes).pack(), b"\0" * nbytes]
        answers.append(stranger_frames(route["address"], push, timeout_ms=500))
    assert len(master.pushes) == 0 and all(len(server.state.staged) == 0 for server in servers)
    assert unchanged(before, servers)
    assert codes == ["UNAUTHENTICATED"] * len(STRANGERS) and answers == [None] * len(answers)


def test_a_cluster_cannot_push_under_another_clusters_ticket(job):
    master, servers, address, client, _ = job
    ticket = client.request_push()["ticket"]
    other = ClusterClient(address, "c2", log=lambda _: None)
    try:
        with pytest.raises(DataFlowError, match=f"ticket {ticket} was not issued to cluster/c2"):
            other.layers.push(ticket, model_tensors(), [layer.name for layer in master.layers], None)
    finally:
        other.close(leave=False)
    assert all(len(server.state.staged[ticket]) == 0 for server in servers)


def test_a_push_claiming_forged_tokens_counts_at_most_what_h_steps_of_the_runs_batch_consume(tmp_path):
    with running_ps(tmp_path, clusters=("c1", ), mode="sync", inner_steps=1, eval_sequences=0) as (master, _, address):
        client = ClusterClient(address, "c1", log=lambda _: None)
        tensors = model_tensors()
        for value in tensors.values():
            value -= 0.001
        result = client.sync(tensors, tokens=10**9, loss=3.0)
        client.close()
    train = master.config.train
    cap = 1 * train.global_batch * (train.seq_len or preset("tiny").max_seq_len)
    rounds = [e for e in events(tmp_path) if e["event"] == "round"]
    assert result.status == "applied" and rounds[0]["tokens"] == cap
    assert [(e["claimed"], e["counted"]) for e in events(tmp_path) if e["event"] == "tokens_capped"] == [(10**9, cap)]


@pytest.mark.parametrize("kind", STRANGERS)
def test_a_shard_cannot_be_re_registered_by_a_stranger_or_by_another_shard(job, kind):
    master, servers, address, _, _ = job
    before = master.shards[1].data
    bogus = {"index": 1, "control": "127.0.0.1:9", "data": "tcp://127.0.0.1:9", "version": 0}
    code, _ = stranger_call(address, "RegisterShard", bogus, kind, caller="shard/1")
    assert master.shards[1].alive and master.shards[1].data == before and code == "UNAUTHENTICATED"
    with pytest.raises(Rejected, match="shard/0 cannot speak for shard 1"):
        servers[0].master.call("RegisterShard", **bogus)
    assert master.shards[1].alive and master.shards[1].data == before


@pytest.mark.parametrize("kind", STRANGERS)
def test_a_stranger_cannot_drive_a_shards_rounds_to_poison_the_model(job, kind):
    master, servers, _, _, _ = job
    server = servers[0]
    control = f"127.0.0.1:{server.control_port}"
    before = shard_parameters(servers)
    ticket = 4242
    codes = {"Expect": stranger_call(control, "Expect", {"ticket": ticket, "cluster": "c1"}, kind, "master")[0]}
    for route in [r for r in master.routes() if r["shard"] == 0]:  # NaN layers under the made-up ticket
        nan = np.full(master.layers[route["index"]].nbytes // 4, math.nan, dtype=np.float32)
        stranger_frames(route["address"], [wire.Header(wire.PUSH, route["index"], ticket, 0, nan.nbytes).pack(), nan],
                        timeout_ms=500)
    for method, request in [("Holds", {"tickets": [ticket]}), ("Measure", {"tickets": [ticket]}),
                            ("Prepare", {"round": 99, "weights": {str(ticket): 1.0}, "clip": 1.0}),
                            ("Commit", {"round": 99}), ("Forget", {"tickets": [ticket]})]:
        codes[method] = stranger_call(control, method, request, kind, "master")[0]
    assert all(torch.isfinite(value).all() for value in shard_parameters(servers).values())
    assert unchanged(before, servers)
    assert set(codes.values()) == {"UNAUTHENTICATED"}, codes


def test_a_strangers_ticket_flood_stages_nothing(job):
    master, servers, _, _, _ = job
    control = f"127.0.0.1:{servers[0].control_port}"
    expect = lambda ticket: {"ticket": ticket, "cluster": "c1"}  # noqa: E731
    codes = {stranger_call(control, "Expect", expect(ticket), caller="master")[0] for ticket in range(1, 101)}
    assert len(servers[0].state.staged) == 0 and codes == {"UNAUTHENTICATED"}


def test_pending_tickets_are_bounded_one_per_cluster_and_a_few_per_shard(job):
    master, servers, _, client, _ = job
    shard = servers[0].state
    for _ in range(20):  # a cluster asking for ticket after ticket holds one at a time
        client.request_push()
    assert len(master.pushes) == 1 and len(shard.staged) == 1
    refused = 0
    for ticket in range(1000, 1050):  # even the master's own announcements are bounded on the shard
        try:
            master.shards[0].control.call("Expect", ticket=ticket, cluster="c1")
        except Rejected:
            refused += 1
    assert len(shard.staged) == 2 * len(master.clusters) + 2 and refused == 50 - (len(shard.staged) - 1)


def test_an_uncommitted_ticket_expires_on_the_master_and_on_the_shards(job):
    master, servers, _, client, _ = job
    shard = servers[0].state
    client.request_push()
    master.ticket_ttl_s = 0.3
    deadline = time.monotonic() + 5
    while (master.pushes or shard.staged) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not master.pushes and not shard.staged
    assert [e["cluster"] for e in events(job[4]) if e["event"] == "ticket_expired"] == ["c1"]
    shard.ticket_ttl_s = 0.3  # the shard also drops stale tickets by itself (a master that died mid-push)
    master.shards[0].control.call("Expect", ticket=1, cluster="c1")
    time.sleep(0.5)
    master.shards[0].control.call("Expect", ticket=2, cluster="c1")
    assert list(shard.staged) == [2]


class Recorder(grpc.UnaryUnaryClientInterceptor):
    """Captures the calls a legitimate client makes (what an eavesdropper on the network sees)."""

    def __init__(self):
        self.calls = []

    def intercept_unary_unary(self, continuation, details, request):
        self.calls.append((details.method, request, list(details.metadata or ())))
        return continuation(details, request)


def test_a_captured_valid_call_cannot_be_replayed(job):
    master, _, address, client, out = job
    recorder = Recorder()
    client.master.channel = grpc.intercept_channel(client.master.channel, recorder)
    client.master._methods.clear()
    client.master.call("Pulled", cluster="c1", session=client.session, version=0, pull_s=77.5, bytes=1)
    method, body, metadata = recorder.calls[-1]
    channel = grpc.insecure_channel(address)
    with pytest.raises(grpc.RpcError) as error:
        channel.unary_unary(method)(body, timeout=10, metadata=metadata)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED and "replayed" in error.value.details()
    assert len([e for e in events(out) if e["event"] == "pull" and e["pull_s"] == 77.5]) == 1


def test_a_call_signed_outside_the_replay_window_is_refused(job):
    master, _, address, client, _ = job
    body = json.dumps({"cluster": "c1", "session": client.session}).encode()
    signer = client.master.signer
    real_time = time.time
    try:
        time.time = lambda: real_time() - 3600  # signed an hour ago (a stale capture)
        metadata, _ = signer.sign("Beat", body)
    finally:
        time.time = real_time
    channel = grpc.insecure_channel(address)
    with pytest.raises(grpc.RpcError) as error:
        channel.unary_unary(f"/{SERVICE}/Beat")(body, timeout=10, metadata=metadata)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED and "off this host's clock" in error.value.details()


def test_a_forged_reply_is_refused_by_the_client(job):
    """A server without the run's keys (a man in the middle, a stranger on a master's old port) answers
    whatever it likes; a participant refuses the unsigned reply."""
    _, _, _, client, _ = job
    impostor = grpc.server(ThreadPoolExecutor(max_workers=2))
    fake = grpc.unary_unary_rpc_method_handler(lambda request, context: b'{"finished": true, "version": 99}')
    impostor.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Beat": fake}), ))
    port = impostor.add_insecure_port("127.0.0.1:0")
    impostor.start()
    try:
        control = Control(f"127.0.0.1:{port}", client.master.signer)
        with pytest.raises(Rejected, match="the reply is not signed by the run's credentials"):
            control.call("Beat", cluster="c1", session=client.session)
    finally:
        impostor.stop(0)


def test_concurrent_participants_still_train_under_authentication(tmp_path):
    """Two clusters, one dips round each, through the signed control flow and the CURVE data flow."""
    with running_ps(tmp_path, clusters=("c1", "c2"), mode="dips", grace_s=2.0, eval_sequences=0) as (_, _, address):
        clients = {cid: ClusterClient(address, cid, log=lambda _: None) for cid in ("c1", "c2")}
        tensors = {cid: model_tensors() for cid in clients}
        results = sync_together(clients, tensors, tokens=512)
    assert {cid: result.status for cid, result in results.items()} == {"c1": "applied", "c2": "applied"}
