"""A shard's snapshots: safetensors with their SHA-256 beside them, checked before they are read; a
damaged or earlier-format one is refused in one line; a full disk or an I/O error while one is written
skips the round in one line naming the file and the errno, the previous snapshot intact."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch

from h2.core import files
from h2.core.dips import OuterOptions
from h2.core.errors import RunFailed, UserError
from h2.core.model_config import resolve_model
from h2.ps.layout import model_layers
from h2.ps.rpc import Rejected
from h2.ps.shard import ShardState

MODEL, SEED = "tiny", 7


def shard(folder) -> ShardState:
    layers = model_layers(resolve_model(MODEL))[:2]
    return ShardState(0, layers, OuterOptions(), str(folder))


def started(folder, version: int = 0) -> ShardState:
    state = shard(folder)
    state.start(version, MODEL, SEED)
    return state


def run_round(state: ShardState, round_id: int = 1) -> int:
    """One round of one push (every layer moved by 0.01) through the shard's own calls: its new version."""
    ticket = 100 + round_id
    state.expect(ticket, "a")
    for name, layer in state.layers.items():
        pushed = (state.params[name] - 0.01).numpy().astype(np.float32)
        state.on_push(ticket, name, memoryview(pushed.tobytes()), "a")
    assert state.missing([ticket]) == {}
    state.measure([ticket])
    version = state.prepare(round_id, {ticket: 1.0}, 1.0)
    assert version == state.version + 1
    return state.commit(round_id)


def test_a_snapshot_is_safetensors_with_its_sha256_and_reads_back_as_written(tmp_path):
    state = started(tmp_path)
    assert run_round(state) == 1
    assert sorted(os.listdir(tmp_path)) == [
        "v000000.safetensors", "v000000.safetensors.sha256", "v000001.safetensors", "v000001.safetensors.sha256"
    ]
    again = started(tmp_path, 1)
    for name in state.layers:
        assert torch.equal(again.params[name], state.params[name])
        assert torch.equal(again.momentum[name], state.momentum[name])


def test_a_damaged_snapshot_is_refused_in_one_line_naming_it(tmp_path):
    run_round(started(tmp_path))
    path = tmp_path / "v000001.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = bytes(4096)
    path.write_bytes(bytes(data))
    with pytest.raises(UserError) as refused:
        started(tmp_path, 1)
    assert str(refused.value) == f"{path}: its SHA-256 differs from the one written beside it (damaged or replaced)"


def test_a_snapshot_without_its_digest_is_refused_as_cut_short(tmp_path):
    run_round(started(tmp_path))
    os.remove(tmp_path / "v000001.safetensors.sha256")
    with pytest.raises(UserError, match=r"v000001.safetensors: has no .sha256 beside it \(its write was cut short\)$"):
        started(tmp_path, 1)


def test_an_earlier_pickled_snapshot_is_refused_in_one_line_not_unpickled(tmp_path):
    torch.save({"version": 3, "params": {}, "momentum": {}}, tmp_path / "v000003.pt")
    with pytest.raises(UserError) as refused:
        started(tmp_path, 3)
    assert str(refused.value).startswith(f"{tmp_path}/v000003.pt: a snapshot of an earlier H2 (a pickled .pt file), "
                                         f"not loaded")


def fail_snapshot_writes(monkeypatch, how: str) -> None:
    """Version 1's snapshot write fails half-way with ENOSPC, or its digest's rename with EIO."""
    real_write, real_replace = files._write_plain, files.os.replace

    def write(handle, data):
        if how == "ENOSPC" and "v000001.safetensors.tmp" in handle.name:
            handle.write(data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(handle, data)

    def replace(src, dst):
        if how == "EIO" and str(dst).endswith("v000001.safetensors.sha256"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_replace(src, dst)

    monkeypatch.setattr(files, "_write_plain", write)
    monkeypatch.setattr(files.os, "replace", replace)


@pytest.mark.parametrize("how, file, text", [("ENOSPC", "v000001.safetensors", "No space left on device (ENOSPC)"),
                                             ("EIO", "v000001.safetensors.sha256", "Input/output error (EIO)")])
def test_a_failed_snapshot_write_skips_the_round_in_one_line_and_the_previous_snapshot_stays(
        tmp_path, monkeypatch, how, file, text):
    state = started(tmp_path)
    fail_snapshot_writes(monkeypatch, how)
    with pytest.raises(Rejected) as refused:
        run_round(state)
    assert str(refused.value) == (f"shard 0: cannot write {tmp_path}/{file}: {text}; the previous snapshot "
                                  f"{tmp_path}/v000000.safetensors is intact")
    assert sorted(os.listdir(tmp_path)) == ["v000000.safetensors", "v000000.safetensors.sha256"]
    assert state.version == 0 and state.prepared is None
    monkeypatch.undo()
    assert started(tmp_path, 0).version == 0


def test_a_failed_first_snapshot_is_a_run_failure_in_one_line(tmp_path, monkeypatch):

    def failing(handle, data):
        raise OSError(errno.EIO, "x")

    monkeypatch.setattr(files, "_write_plain", failing)
    with pytest.raises(
            RunFailed, match=r"^shard 0: cannot write .*/v000000.safetensors: x \(EIO\); no earlier "
            r"snapshot was written$"):
        started(tmp_path)
    assert os.listdir(tmp_path) == []


class RestartedMaster:
    """A master that no longer knows the shard (its beat is rejected) and asks it to load version 1."""

    def call(self, method: str, **request):
        raise Rejected("shard 0 is not registered here: register again")

    def call_until(self, method: str, **request):
        return {"reload": 1, "tickets": []}


def test_a_damaged_snapshot_met_when_registering_again_stops_the_shard_with_that_line(tmp_path):
    import threading

    from h2.ps.shard import ShardServer
    state = started(tmp_path)
    run_round(state)
    with open(state.snapshot_path(1), "r+b") as handle:
        handle.seek(64)
        handle.write(bytes(4096))
    server = ShardServer.__new__(ShardServer)
    server.index, server.state, server.model, server.seed = 0, state, MODEL, SEED
    server.master, server.heartbeat_s, server.host, server.control_port = RestartedMaster(), 0.01, "127.0.0.1", 0
    server.data = type("Data", (), {"port": 0, "close": lambda self: None})()
    server.control = type("Control", (), {"stop": lambda self, grace: None})()
    server.stopped, server.failure = threading.Event(), None
    beat = threading.Thread(target=server._beat_loop)
    beat.start()
    beat.join(timeout=30)
    assert not beat.is_alive() and server.stopped.is_set()
    with pytest.raises(UserError, match="v000001"):
        server.serve_forever()
