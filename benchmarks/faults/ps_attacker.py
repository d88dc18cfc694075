"""A foreign local process attacking a running Di-PS job: the fault campaign's `security` family runs it.

It knows what a stranger on the network knows (the master's and the shards' addresses, the shards' public
CURVE keys, the wire formats: the code is public) and, for the replay attacks, calls it captured off the
wire; it holds no credential of the run. It reads one attack as JSON on stdin and prints, as JSON, what
each of its attempts got: a gRPC status code name ("OK" with the reply when the server answered), or for
frames sent to a shard's data port "answered" (with the answer's header) or "none".

Run: python benchmarks/faults/ps_attacker.py < attack.json   (the campaign writes the JSON)
"""

from __future__ import annotations

import json
import math
import random
import secrets
import sys
import time

import grpc
import numpy as np
import zmq

from h2.ps import wire
from h2.ps.auth import Signer

SERVICE = "h2.ps.Control"
CALLERS = ("cluster/c1", "cluster/c2", "master", "shard/0", "shard/1", "cluster/../c1", "")


def metadata(rng: random.Random, method: str, body: bytes) -> list | None:
    """No credential, a credential of another run (signed under a key this run never issued), or
    made-up signature headers (malformed times, random MACs)."""
    kind = rng.choice(("none", "foreign", "garbage"))
    if kind == "none":
        return None
    caller = rng.choice(CALLERS) or "cluster/c1"
    if kind == "foreign":
        return Signer(caller, secrets.token_bytes(32)).sign(method, body)[0]
    stamp = rng.choice([f"{time.time():.6f}", "nan", "inf", "-1", "1e400", "x", str(2**70)])
    return [("h2ps-caller", caller), ("h2ps-time", stamp), ("h2ps-nonce", secrets.token_hex(rng.randint(1, 32))),
            ("h2ps-mac", secrets.token_hex(rng.choice([1, 16, 32])))]


def call(address: str, method: str, request: dict, rng: random.Random, meta=None, body: bytes | None = None) -> dict:
    body = json.dumps(request).encode() if body is None else body
    channel = grpc.insecure_channel(address)
    try:
        raw = channel.unary_unary(f"/{SERVICE}/{method}")(
            body, timeout=20, metadata=meta if meta is not None else metadata(rng, method, body))
        return {"what": f"{method} at {address}", "got": "OK", "reply": raw.decode(errors="replace")[:200]}
    except grpc.RpcError as error:
        return {"what": f"{method} at {address}", "got": error.code().name}
    finally:
        channel.close()


def frames(address: str, parts: list, rng: random.Random, server_key: str) -> dict:
    """Frames to a shard's data port: without CURVE, or with CURVE and keys the run never admitted."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    curve = rng.random() < 0.5
    if curve:
        public, secret = zmq.curve_keypair()
        socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = server_key.encode(), public, secret
    socket.connect(address)
    try:
        socket.send_multipart(parts)
        if not socket.poll(rng.randint(200, 800)):
            return {"what": f"frames at {address} (curve {curve})", "got": "none"}
        answer = socket.recv_multipart()
        return {"what": f"frames at {address} (curve {curve})", "got": "answered", "reply": repr(answer[:1])[:200]}
    finally:
        socket.close()


def header(kind: int, index: int, ticket: int, version: int, nbytes: int) -> bytes:
    return wire.Header(kind, index, ticket, version, nbytes).pack()


def payload(rng: random.Random, nbytes: int) -> bytes:
    fill = rng.choice([0.0, math.nan, math.inf, 1e30, rng.uniform(-1, 1)])
    return np.full(max(nbytes, 0) // 4, fill, dtype=np.float32).tobytes()


def some_ticket(rng: random.Random, spec: dict) -> int:
    return spec.get("ticket") or rng.choice([1, 4242, rng.getrandbits(62), 2**63 - 1])


# ---- the attacks: each returns its attempts ----------------------------------------------------------
def status(rng, spec):
    return [call(spec["master"], "Status", {}, rng)] + [call(c, "Status", {}, rng) for c in spec["shard_controls"]]


def pull(rng, spec):
    return [
        frames(r["address"], [header(wire.PULL, r["index"], 0, rng.choice([0, 1, -1 & 0xFFFF]), 0), b""], rng,
               r["server_key"]) for r in rng.sample(spec["routes"], rng.randint(1, len(spec["routes"])))
    ]


def pulled(rng, spec):
    request = {"cluster": rng.choice(["c1", "c2"]), "version": 0, "pull_s": spec["marker"], "bytes": rng.randint(1, 9)}
    if rng.random() < 0.5:
        request["session"] = spec["session"]  # the real session (a stranger may have seen it)
    return [call(spec["master"], "Pulled", request, rng)]


def join(rng, spec):
    return [call(spec["master"], "Join", {"cluster": rng.choice(["c1", "c2"])}, rng)]


def leave(rng, spec):
    request = {"cluster": "c1"} if rng.random() < 0.5 else {"cluster": "c1", "session": spec["session"]}
    return [call(spec["master"], "Leave", request, rng)]


def forged_tokens(rng, spec):
    """A push ticket asked for and committed as c1 claiming a billion tokens, and layers pushed under it."""
    ticket = some_ticket(rng, spec)
    attempts = [
        call(spec["master"], "RequestPush", {"cluster": "c1", "session": spec["session"], "base_version": 0}, rng)
    ]
    for route in rng.sample(spec["routes"], rng.randint(1, len(spec["routes"]))):
        nbytes = spec["nbytes"][route["index"]]
        attempts.append(
            frames(route["address"], [header(wire.PUSH, route["index"], ticket, 0, nbytes),
                                      payload(rng, nbytes)], rng, route["server_key"]))
    attempts.append(
        call(
            spec["master"], "CommitPush", {
                "cluster": "c1", "session": spec["session"], "ticket": ticket, "tokens": rng.choice([10**9, 2**62, 1]),
                "loss": rng.choice([0.0, 3.0])
            }, rng))
    return attempts


def under_ticket(rng, spec):
    """Layers pushed under the ticket the real c1 holds now (a stranger learnt it), then committed."""
    spec = dict(spec, ticket=spec["held_ticket"])
    return forged_tokens(rng, spec)


def shard_register(rng, spec):
    index = rng.randrange(len(spec["shard_controls"]))
    port = rng.choice([9, 1, 65535])
    bogus = {"index": index, "control": f"127.0.0.1:{port}", "data": f"tcp://127.0.0.1:{port}", "version": 0}
    return [call(spec["master"], "RegisterShard", bogus, rng), call(spec["master"], "ShardBeat", {"index": index}, rng)]


def shard_control(rng, spec):
    control = rng.choice(spec["shard_controls"])
    ticket = some_ticket(rng, spec)
    attempts = [call(control, "Expect", {"ticket": ticket, "cluster": "c1"}, rng)]
    for route in spec["routes"]:
        nbytes = spec["nbytes"][route["index"]]
        attempts.append(
            frames(route["address"], [header(wire.PUSH, route["index"], ticket, 0, nbytes),
                                      payload(rng, nbytes)], rng, route["server_key"]))
    for method, request in [("Holds", {"tickets": [ticket]}), ("Measure", {"tickets": [ticket]}),
                            ("Prepare", {"round": rng.randint(0, 99), "weights": {str(ticket): 1.0}, "clip": 1.0}),
                            ("Commit", {"round": rng.randint(0, 99)}), ("Forget", {"tickets": [ticket]})]:
        attempts.append(call(control, method, request, rng))
    return attempts


def ticket_flood(rng, spec):
    control = rng.choice(spec["shard_controls"])
    count = rng.randint(20, 80)
    attempts = [call(control, "Expect", {"ticket": rng.getrandbits(62), "cluster": "c1"}, rng) for _ in range(count)]
    attempts += [
        call(spec["master"], "RequestPush", {"cluster": "c1", "base_version": 0}, rng)
        for _ in range(rng.randint(5, 20))
    ]
    return attempts


def replay(rng, spec):
    """Calls the real c1 made (captured off the wire), sent again byte for byte."""
    return [
        call(spec["master"], captured["method"], {}, rng, [tuple(pair)
                                                           for pair in captured["metadata"]], captured["body"].encode())
        for captured in spec["captured"]
    ]


ATTACKS = {
    "status": status, "pull": pull, "pulled": pulled, "join": join, "leave": leave, "forged-tokens": forged_tokens,
    "under-ticket": under_ticket, "shard-register": shard_register, "shard-control": shard_control,
    "ticket-flood": ticket_flood, "replay": replay, "stale": replay
}


def main() -> int:
    spec = json.load(sys.stdin)
    rng = random.Random(spec["seed"])
    time.sleep(rng.uniform(0.0, 0.3))
    print(json.dumps(ATTACKS[spec["attack"]](rng, spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
