"""An in-process Di-PS run for tests: the master and its shard servers as threads of the test process, with
the run's secrets in `<out>/secrets/` and $H2_PS_SECRET_FILE naming the run secret while it runs (so the
clusters the tests start, in-process or as rank processes, find their credentials as launched ones do)."""

from __future__ import annotations

import contextlib
import os
import threading

import torch
import zmq

from h2.core.dips import ClusterSpec, DipsConfig, OuterOptions, check_dips_config
from h2.core.model_config import preset
from h2.core.training import TrainConfig
from h2.model.transformer import Transformer
from h2.ps import wire
from h2.ps.auth import MASTER, SECRET_ENV, Credential, load_secret_file, shard_name, write_run_secrets
from h2.ps.client import ClusterClient
from h2.ps.master import Master
from h2.ps.rpc import Control
from h2.ps.shard import ShardServer


@contextlib.contextmanager
def running_ps(out_dir, *, clusters=("a", "b"), shards=2, missed_beats=50, **fields):
    """Heartbeats every 0.2 s; a participant is dropped after `missed_beats` of them (10 s by default, so a
    loaded CI host's stall of a second does not drop a cluster from a test that counts its rounds; tests of
    dropping pass a small number)."""
    config = DipsConfig(out=str(out_dir), shards=shards, clusters=[ClusterSpec(id=c)
                                                                   for c in clusters], heartbeat_s=0.2,
                        missed_beats=missed_beats, train=TrainConfig(steps=8, checkpoint_every=0), **fields)
    check_dips_config(config, "test")
    secret_file = write_run_secrets(os.path.join(str(out_dir), "secrets"), shards, list(clusters))
    master = Master(config, "test.yaml", port=0, credential=load_secret_file(secret_file, MASTER))
    address = f"127.0.0.1:{master.port}"
    servers = [
        ShardServer(address, index, "127.0.0.1", 0, 0, credential=load_secret_file(secret_file, shard_name(index)))
        for index in range(shards)
    ]
    previous = os.environ.get(SECRET_ENV)
    os.environ[SECRET_ENV] = secret_file
    try:
        yield master, servers, address
    finally:
        if previous is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = previous
        for server in servers:
            server.close()
        master.close()


def credential_of(master: Master, participant: str) -> Credential:
    """A participant's real credential (from the run secret the master holds)."""
    return Credential(participant, master.credential.key_of(participant))


def control_as(master: Master, participant: str) -> Control:
    """A control client of the master speaking as `participant` with its real credential."""
    return Control(f"127.0.0.1:{master.port}", credential_of(master, participant).signer())


def data_frames(address: str, frames: list, curve: tuple[bytes, bytes, bytes] | None = None, timeout_ms: int = 3000):
    """Send `frames` to a shard's data port from a raw ZeroMQ socket (`curve`: the server's public key,
    then the client's public and secret keys; None: no CURVE); its parsed answer, or None if none came."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = curve
    socket.connect(address)
    try:
        socket.send_multipart(frames)
        if not socket.poll(timeout_ms):
            return None
        return wire.parse(socket.recv_multipart(), max_payload=1 << 30)
    finally:
        socket.close()


def model_tensors() -> dict[str, torch.Tensor]:
    """The tiny model's parameters as seed 0 initialises them (what a cluster holds before it trains)."""
    torch.manual_seed(0)
    return {name: param.detach().clone() for name, param in Transformer(preset("tiny")).named_parameters()}


def sync_together(clients: dict[str, ClusterClient], tensors: dict[str, dict], tokens: int, close: bool = True) -> dict:
    """Every client's sync of its tensors (claiming `tokens`, loss 3.0) at once, one thread each; their
    results by cluster; the clients are closed after unless `close` is False."""
    results = {}
    threads = [
        threading.Thread(
            target=lambda cid=cid: results.__setitem__(cid, clients[cid].sync(tensors[cid], tokens=tokens, loss=3.0)))
        for cid in clients
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for client in clients.values() if close else ():
        client.close()
    return results


__all__ = ["running_ps", "credential_of", "control_as", "data_frames", "model_tensors", "sync_together", "OuterOptions"]
