"""The setup listener against strangers: idle, slow or garbage connections cannot hold up a job's
peers, a peer cannot flood a rank with messages nobody posted a receive for, the listener listens
only on the address the job uses; shm setup leaves nothing in /dev/shm, takes only the files its
peer announced, and removes the named segments that killed processes of older builds left."""
import errno
import fcntl
import hashlib
import hmac
import os
import secrets
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

import dicomm
from dicomm import _dicomm_core as core
from scenarios import run, start
from test_faults import impersonate_rank_1, read_descriptor


def strangers(address, port, idle, slow, garbage):
    """Connections that never say hello, that send half a frame header, or that send junk."""
    opened = []
    for count, first_bytes in ((idle, b""), (slow, b"DICO"), (garbage, b"\xff" * 64)):
        for _ in range(count):
            s = socket.create_connection((address, port))
            if first_bytes:
                s.sendall(first_bytes)
            opened.append(s)
    return opened


@pytest.mark.parametrize("idle, slow, garbage", [(20, 20, 10), (60, 30, 10)])  # 100: past the pending cap
def test_idle_slow_and_garbage_connections_add_under_a_second_to_setup(idle, slow, garbage):
    store_dir = tempfile.mkdtemp()
    with start("echo", ranks=[0], store_dir=store_dir, token="t") as listener:
        address, port = read_descriptor(store_dir, 0)
        opened = strangers(address, port, idle, slow, garbage)
        with start("echo", ranks=[1], store_dir=store_dir, token="t") as talker:
            (talked, ) = talker.results(timeout=120)
            (listened, ) = listener.results(timeout=120)
        for s in opened:
            s.close()
    assert listened["data"] == "hello"
    assert talked["setup_s"] < 1.0, talked["setup_s"]


def test_an_unposted_flood_is_refused_at_its_budget_naming_peer_and_tag():
    store_dir = tempfile.mkdtemp()
    budget, piece = 1 << 20, 256 << 10
    with start("echo", ranks=[0], store_dir=store_dir, token="t", request_timeout=30,
               env={"DICOMM_UNEXPECTED_BYTES": str(budget)}) as victim:
        s = impersonate_rank_1(store_dir, "t")
        for seq in range(2 * budget // piece):
            frame = core.encode_frame_header("Data", tag=5, seq=seq, total_bytes=piece, payload_bytes=piece)
            try:
                s.sendall(frame + b"z" * piece)
            except OSError:  # the victim closed the connection at its budget
                break
        (result, ) = victim.results(timeout=60)
        s.close()
    assert "rank 1" in result["error"] and "tag 5" in result["error"] and "budget of 1048576 bytes" in result["error"]


def test_the_listener_binds_the_advertised_address_only():
    store_dir = tempfile.mkdtemp()
    with start("echo", ranks=[0], store_dir=store_dir, token="t",
               env={"DICOMM_ADVERTISE_ADDR": "127.0.0.2"}) as listener:
        address, port = read_descriptor(store_dir, 0)
        assert address == "127.0.0.2"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with start("echo", ranks=[1], store_dir=store_dir, token="t") as talker:
            talker.results(timeout=60)
            (listened, ) = listener.results(timeout=60)
    assert listened["data"] == "hello"


def test_an_shm_endpoint_removes_segments_that_killed_processes_left(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    left = f"/dev/shm/dicomm-{child.pid}-7-0-bell"
    with open(left, "wb") as handle:
        handle.write(b"\0" * 64)
    alive = f"/dev/shm/dicomm-{os.getpid()}-7-0-bell"
    with open(alive, "wb") as handle:
        handle.write(b"\0" * 64)
    try:
        (listened, _) = run("echo", transport="shm", token="t")
        assert listened["data"] == "hello"
        assert not os.path.exists(left) and os.path.exists(alive)
    finally:
        for path in (left, alive):
            if os.path.exists(path):
                os.remove(path)


def answer_as_listener(connection, token):
    """The listener's side of the handshake as rank 0 holding `token`: a challenge, then the
    proof of the token for the dialer's hello (docs/dicomm.md, "Setup")."""
    nonce = secrets.token_hex(16)
    challenge = f"rank=0\nnonce={nonce}\n".encode()
    connection.sendall(core.encode_frame_header("Hello", payload_bytes=len(challenge)) + challenge)
    header = core.decode_frame_header(connection.recv(core.FRAME_HEADER_BYTES, socket.MSG_WAITALL))
    hello = dict(
        line.split("=", 1)
        for line in connection.recv(header["payload_bytes"], socket.MSG_WAITALL).decode().splitlines())
    transcript = (f"dicomm-reply-v1\nlistener_rank=0\nlistener_nonce={nonce}\ndialer_rank={hello['rank']}\n"
                  f"dialer_nonce={hello['nonce']}\ntransport={hello['transport']}\n")
    reply = f"proof={hmac.new(token.encode(), transcript.encode(), hashlib.sha256).hexdigest()}\n".encode()
    connection.sendall(core.encode_frame_header("HelloReply", payload_bytes=len(reply)) + reply)


def shm_setup_frame_of_rank_1(store_dir, token="t"):
    """Plays rank 0 up to rank 1's shm setup message (sent once rank 1's shm transport, doorbell
    included, exists); returns the setup connection, left open so rank 1 waits for our answer."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    descriptor = (f"rank=0\naddress=127.0.0.1\nport={listening.getsockname()[1]}\nhost_id=fake\npid={os.getpid()}\n"
                  "ibverbs=0\nibverbs_device=\n")
    dicomm.FileStore(store_dir).set("dicomm/peer/0", descriptor)
    listening.settimeout(60)
    connection, _ = listening.accept()
    listening.close()
    connection.settimeout(60)
    answer_as_listener(connection, token)
    setup = connection.recv(core.FRAME_HEADER_BYTES, socket.MSG_WAITALL)
    assert core.decode_frame_header(setup)["kind"] == "Hello"
    connection.recv(core.decode_frame_header(setup)["payload_bytes"], socket.MSG_WAITALL)
    return connection


def test_a_rank_killed_during_shm_setup_leaves_no_segment_in_dev_shm():
    store_dir = tempfile.mkdtemp()
    with start("token", ranks=[1], transport="shm", store_dir=store_dir, tokens=["t", "t"], connect_timeout=60,
               env={"DICOMM_HOST_ID": "fake"}) as killed:
        pid = killed.pid(1)
        connection = shm_setup_frame_of_rank_1(store_dir)
        with open(f"/proc/{pid}/maps") as maps:
            assert "bell" in maps.read()  # its doorbell is mapped: the kill comes after it was made
        killed.kill(1)
        killed.wait(1, timeout=30)
        connection.close()
    assert [name for name in os.listdir("/dev/shm") if name.startswith(f"dicomm-{pid}-")] == []


def test_an_shm_peer_announcing_a_file_with_another_nonce_is_refused_naming_the_rank():
    store_dir = tempfile.mkdtemp()
    with start("token", ranks=[1], transport="shm", store_dir=store_dir, tokens=["t", "t"], connect_timeout=60,
               env={"DICOMM_HOST_ID": "fake"}) as job:
        connection = shm_setup_frame_of_rank_1(store_dir)
        forged = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
        header_bytes, ring_control_bytes, ring_bytes = 64, 4096, 4096
        os.ftruncate(forged, header_bytes + ring_control_bytes + ring_bytes)
        os.pwrite(forged, struct.pack("<QQ", int.from_bytes(b"COMMCSHM", "little"), 12345), 0)  # magic, nonce
        fcntl.fcntl(forged, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        setup = (f"ring_fd={forged}\nring_nonce=54321\nring_bytes={ring_bytes}\nbell_fd={forged}\nbell_nonce=12345\n"
                 "probe_address=0\ndevice_direct=0\n").encode()
        connection.sendall(core.encode_frame_header("Hello", payload_bytes=len(setup)) + setup)
        (result, ) = job.results(timeout=60)
        connection.close()
    assert result["error"] == (f"rank 0's shm ring (process {os.getpid()}, descriptor {forged}) is not the file "
                               "it announced (wrong size, seals or nonce)")


def test_shm_setup_takes_the_peers_memory_through_proc_where_pidfd_getfd_is_refused():
    listened, talked = run("echo_refusing_pidfd_getfd", transport="shm", token="t")
    assert listened["pidfd_getfd_errno"] == errno.EPERM and talked["pidfd_getfd_errno"] == errno.EPERM
    assert listened["error"] == "" and listened["data"] == "hello" and listened["transport"] == "shm"


@pytest.mark.parametrize("token, missing_key", [(None, "dicomm/token"), ("t", "dicomm/peer/0")])
def test_connect_timeout_bounds_the_store_look_ups_of_setup(tmp_path, token, missing_key):
    store = dicomm.FileStore(str(tmp_path), timeout=60)  # the store alone would wait 60 s for rank 0's keys
    started = time.monotonic()
    with pytest.raises(dicomm.CommError, match=f"store key '{missing_key}' was not set within the connect timeout"):
        dicomm.Endpoint(store, 1, 2, token=token, connect_timeout=1)
    assert time.monotonic() - started < 10
