"""What the job token and a peer's announcements can and cannot do: the token never crosses the
wire, each end proves it holds the token for this one connection, a failed random draw stops the
setup, and cross-memory writes never land in a process the peer merely named."""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

import dicomm
from dicomm import _dicomm_core as core
from scenarios import run, start
from test_faults import read_descriptor, read_frame

TOKEN = "job-token-" + secrets.token_hex(8)


def fake_listener(store_dir):
    """A plain socket registered in the store as rank 0's listener."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(30)
    descriptor = (f"rank=0\naddress=127.0.0.1\nport={server.getsockname()[1]}\nhost_id=fake\npid={os.getpid()}\n"
                  "ibverbs=0\nibverbs_device=\n")
    dicomm.FileStore(store_dir).set("dicomm/peer/0", descriptor)
    return server


def frame(kind, payload=b""):
    return core.encode_frame_header(kind, payload_bytes=len(payload)) + payload


def challenge(listener_rank=0):
    """What a listener sends first on every accepted connection: its rank and a fresh nonce."""
    return frame("Hello", f"rank={listener_rank}\nnonce={secrets.token_hex(16)}\n".encode())


def everything_sent(connection, quiet_s=2.0):
    """Every byte the other end sends until it closes or stays quiet for `quiet_s`."""
    connection.settimeout(quiet_s)
    seen = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except socket.timeout:
            return seen
        if not chunk:
            return seen
        seen += chunk


def test_a_dialer_never_sends_the_job_token_to_its_listener():
    store_dir = tempfile.mkdtemp()
    server = fake_listener(store_dir)
    with start("token", ranks=[1], store_dir=store_dir, tokens=[TOKEN, TOKEN], connect_timeout=10) as dialer:
        connection, _ = server.accept()
        connection.sendall(challenge())
        seen = everything_sent(connection)
        connection.close()
        dialer.results(timeout=60)
    assert seen.startswith(core.encode_frame_header("Hello")[:8]) and TOKEN.encode() not in seen, seen


def test_a_dialer_refuses_a_listener_that_cannot_prove_it_holds_the_job_token():
    store_dir = tempfile.mkdtemp()
    server = fake_listener(store_dir)
    with start("token", ranks=[1], store_dir=store_dir, tokens=[TOKEN, TOKEN], connect_timeout=10) as dialer:
        connection, _ = server.accept()
        connection.settimeout(30)
        connection.sendall(challenge())
        read_frame(connection)
        connection.sendall(frame("HelloReply", b"proof=" + b"0" * 64 + b"\n"))
        (result, ) = dialer.results(timeout=60)
        connection.close()
    assert result["error"].startswith("rank 0 at 127.0.0.1:") and "job token mismatch" in result["error"], result


def test_a_hello_proved_for_another_connections_nonce_is_refused():
    store_dir = tempfile.mkdtemp()
    with start("echo", ranks=[0], store_dir=store_dir, token="t") as listener:
        address, port = read_descriptor(store_dir, 0)
        first = socket.create_connection((address, port), timeout=10)
        second = socket.create_connection((address, port), timeout=10)
        _, first_challenge = read_frame(first)
        read_frame(second)
        second.sendall(frame("Hello", core.encode_hello(1, "t", "tcp", first_challenge)))
        reply, reason = read_frame(second)
        first.close()
        second.close()
        with start("echo", ranks=[1], store_dir=store_dir, token="t") as talker:
            talker.results(timeout=60)
            listener.results(timeout=60)
    assert reply["kind"] == "HelloReply" and b"job token mismatch" in reason, (reply, reason)


def test_a_user_provided_token_is_never_written_to_the_store():
    store_dir = tempfile.mkdtemp()
    with start("echo", store_dir=store_dir, token=TOKEN) as job:
        (listened, _) = job.results(timeout=60)
    stored = b"".join(open(os.path.join(store_dir, name), "rb").read() for name in os.listdir(store_dir))
    assert listened["data"] == "hello" and TOKEN.encode() not in stored


GETRANDOM_FAILS_FOR_DICOMM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
/* getrandom() fails with EIO when DiComm's extension calls it (only for draws of
   FAIL_GETRANDOM_OF_BYTES bytes where that is set); the interpreter's own calls work. */
ssize_t getrandom(void *buffer, size_t length, unsigned int flags) {
  const char *only = getenv("FAIL_GETRANDOM_OF_BYTES");
  Dl_info caller;
  if ((!only || strtoul(only, NULL, 10) == length) && dladdr(__builtin_return_address(0), &caller) &&
      caller.dli_fname && strstr(caller.dli_fname, "_dicomm_core")) {
    errno = EIO;
    return -1;
  }
  return syscall(SYS_getrandom, buffer, length, flags);
}
"""


@pytest.fixture(scope="module")
def failing_getrandom(tmp_path_factory):
    """A shared library (for LD_PRELOAD) that makes DiComm's getrandom() calls fail with EIO."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc) to build the getrandom shim")
    folder = tmp_path_factory.mktemp("getrandom_shim")
    (folder / "shim.c").write_text(GETRANDOM_FAILS_FOR_DICOMM_C)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "shim.so"), str(folder / "shim.c")], check=True)
    return str(folder / "shim.so")


@pytest.mark.parametrize(
    "transport, tokens, failing_sizes, drawn",
    [
        ("tcp", [None, None], {}, "a job token"),  # rank 0 draws the token first
        ("tcp", ["t", "t"], {}, "a handshake nonce"),  # the user's token: rank 0's first draw is its challenge
        ("shm", ["t", "t"], {"FAIL_GETRANDOM_OF_BYTES": "8"},
         "a shared memory nonce"),  # only 8-byte draws (randomWord) fail: the first is a ring's memfd nonce
    ])
def test_a_failed_getrandom_fails_the_setup_in_one_line_naming_it(failing_getrandom, transport, tokens, failing_sizes,
                                                                  drawn):
    results = run("token", transport=transport, tokens=tokens, connect_timeout=3,
                  env={"LD_PRELOAD": failing_getrandom, **failing_sizes})
    prefix = f"cannot draw {drawn} (getrandom: "
    assert any(r["error"].startswith(prefix) and "\n" not in r["error"] for r in results), results


DECOY_ADDRESS = 0x3E0000000000
DECOY = r"""
import ctypes, sys
from scenarios import map_fixed
address, size = int(sys.argv[1], 0), int(sys.argv[2])
canary = map_fixed(address, size)
ctypes.memset(canary, 0xA5, size)
PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)
ctypes.CDLL(None).prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)  # writable by any process of this user
print("ready", flush=True)
sys.stdin.readline()
print("intact" if bytes(canary).count(0xA5) == size else "changed", flush=True)
"""


def test_shm_writes_never_reach_a_process_a_peer_names_as_its_own():
    """rank 1 announces a sleeping decoy's pid; the decoy keeps a canary where rank 1 receives."""
    size = 8 << 20
    decoy = subprocess.Popen([sys.executable, "-c", DECOY, hex(DECOY_ADDRESS),
                              str(size)], text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             cwd=os.path.dirname(__file__))
    try:
        assert decoy.stdout.readline().strip() == "ready"
        sender, receiver = run("forged_pid", transport="shm", decoy_pid=decoy.pid, address=DECOY_ADDRESS, size=size)
        decoy.stdin.write("check\n")
        decoy.stdin.flush()
        decoy_memory = decoy.stdout.readline().strip()
    finally:
        decoy.kill()
        decoy.wait()
    assert decoy_memory == "intact", (sender, receiver)
    # The shm rings are memfds taken from the announced process, which does not hold them: the sender
    # refuses the setup in one line naming rank 1 (before memfds, the cross-memory probe sent the
    # message through the ring instead).
    assert sender.get("refused", "").startswith("rank 1's shm ring cannot be taken (process "), sender
    assert "\n" not in sender["refused"] and "intact" not in receiver, receiver
