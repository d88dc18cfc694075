"""The scenarios of the multi-process DiComm tests, and `run`/`start` that launch one on local ranks.

A scenario is `scenario(rank, world, store_dir, transport, args)`, run on every rank by h2.core.ranks
(each rank a fresh interpreter with its DICOMM_* environment set before dicomm is imported); what
it returns is that rank's findings. The ranks meet through a FileStore in `store_dir`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

import numpy as np

import dicomm
from h2.core.ranks import RankJob, run_ranks, start_ranks

SIZES = [0, 1, 4095, 4096, (1 << 20) + 3, 64 << 20]


def pattern(size: int, salt: int = 0) -> np.ndarray:
    """Byte i is (31 * i + salt) mod 251: periodic, so built by repeating one period."""
    period = ((np.arange(251, dtype=np.int64) * 31 + salt) % 251).astype(np.uint8)
    return np.resize(period, size)


def endpoint(rank, world, store_dir, transport, **kwargs):
    return dicomm.Endpoint(dicomm.FileStore(store_dir, timeout=30), rank, world,
                           transport=None if transport == "auto" else transport, **kwargs)


def barrier(ep, tag=999_999):
    """Rendezvous of two ranks through a zero-byte exchange."""
    peer = 1 - ep.rank
    r = ep.irecv(bytearray(0), peer, tag)
    ep.send(b"", peer, tag)
    r.wait()


def correctness(rank, world, store_dir, transport, args):
    ep = endpoint(rank, world, store_dir, transport, timeout=60)
    peer = 1 - rank
    found = {"transport": ep.transport(peer)}

    # Every size, receive posted before the send.
    ok = []
    for size in SIZES:
        if rank == 0:
            barrier(ep)
            ep.send(pattern(size), peer, tag=1)
        else:
            buffer = np.zeros(size, np.uint8)
            handle = ep.irecv(buffer, peer, tag=1)
            barrier(ep)
            ok.append(handle.wait() == size and bool((buffer == pattern(size)).all()))
    found["sizes_recv_first"] = ok

    # Every size, send issued well before the receive is posted.
    ok = []
    for size in SIZES:
        if rank == 0:
            handle = ep.isend(pattern(size, 7), peer, tag=2)
            barrier(ep)
            handle.wait()
        else:
            barrier(ep)
            time.sleep(0.02)
            buffer = np.zeros(size, np.uint8)
            ok.append(ep.recv(buffer, peer, tag=2) == size and bool((buffer == pattern(size, 7)).all()))
    found["sizes_send_first"] = ok

    # Unaligned views: buffers starting at an odd address, below and above the shm split size.
    unaligned_ok = True
    for size in (100_002, 300_001):
        backing = np.zeros(size + 1, np.uint8)
        if rank == 0:
            backing[1:] = pattern(size)
            ep.send(backing[1:], peer, tag=3)
        else:
            ep.recv(backing[1:], peer, tag=3)
            unaligned_ok &= bool((backing[1:] == pattern(size)).all())
    found["unaligned"] = unaligned_ok

    # 1,000 outstanding messages in both directions at once, small and a few large.
    count = 1000
    sizes = [(i * 37) % 5000 for i in range(count)] + [300_000] * 8
    recv_buffers = [np.zeros(s, np.uint8) for s in sizes]
    recvs = [ep.irecv(b, peer, tag=10) for b in recv_buffers]
    sends = [ep.isend(pattern(s, i), peer, tag=10) for i, s in enumerate(sizes)]
    for h in sends + recvs:
        h.wait()
    found["outstanding_both_ways"] = all(
        bool((b == pattern(s, i)).all()) for i, (s, b) in enumerate(zip(sizes, recv_buffers)))
    found["outstanding_count"] = len(recvs)

    # Ordering per tag: tags interleaved on the wire, received tag by tag in reverse order.
    tags, per_tag = 4, 50
    if rank == 0:
        handles = [
            ep.isend(np.array([tag, i], np.uint32).tobytes() + bytes(i % 7), peer, tag=100 + tag)
            for i in range(per_tag) for tag in range(tags)
        ]
        for h in handles:
            h.wait()
        barrier(ep)
    else:
        barrier(ep)
        in_order = True
        for tag in reversed(range(tags)):
            for i in range(per_tag):
                buffer = bytearray(8 + 7)
                n = ep.recv(buffer, peer, tag=100 + tag)
                got = np.frombuffer(bytes(buffer[:8]), np.uint32)
                in_order &= (n == 8 + i % 7) and got[0] == tag and got[1] == i
        found["ordered_per_tag"] = bool(in_order)

    # A message larger than the receive buffer fails that receive; the connection keeps working.
    if rank == 0:
        for size in (100, 1 << 20):
            h = ep.isend(pattern(size), peer, tag=20)
            try:
                h.wait()
            except dicomm.CommError:
                pass
        ep.send(b"after", peer, tag=21)
    else:
        errors = []
        for size in (100, 1 << 20):
            try:
                ep.recv(bytearray(size // 2), peer, tag=20)
                errors.append("")
            except dicomm.CommError as e:
                errors.append(str(e))
        buffer = bytearray(5)
        ep.recv(buffer, peer, tag=21)
        found["truncation_errors"] = errors
        found["usable_after_truncation"] = bytes(buffer) == b"after"

    barrier(ep)
    ep.close()
    return found


def current_rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def wait_all(handles):
    for handle in handles:
        handle.wait()
    handles.clear()


def stream(rank, world, store_dir, transport, args):
    """Sends args['messages'] small messages with a window; reports RSS and live requests."""
    ep = endpoint(rank, world, store_dir, transport, timeout=60)
    peer, total, window = 1 - rank, args["messages"], 256
    buffer = np.zeros(64, np.uint8)
    samples = {}
    pending = []
    for i in range(total):
        pending.append(ep.isend(buffer, peer, tag=5) if rank == 0 else ep.irecv(buffer, peer, tag=5))
        if len(pending) == window or (i + 1) % (total // 10) == 0:
            wait_all(pending)
            barrier(ep)  # the sender never runs ahead: stored early messages stay bounded
        if (i + 1) % (total // 10) == 0:
            samples[i + 1] = current_rss_kib()
    barrier(ep)
    ep.close()
    del pending
    return {"rss_kib": samples, "live_requests": dicomm.live_requests()}


def peer_killed(rank, world, store_dir, transport, args):
    """Rank 0 dies while its 64 MiB message is in flight (it reports nothing); rank 1 reports its receive."""
    ep = endpoint(rank, world, store_dir, transport, timeout=60)
    peer = 1 - rank
    receiver_pid_file = os.path.join(store_dir, "receiver.pid")
    if rank == 0:
        barrier(ep)
        with open(receiver_pid_file) as handle:
            receiver_pid = int(handle.read())
        # The receiver is stopped while the send starts and resumed only after this process died, so
        # it cannot drain the 64 MiB first: what was posted fills the socket buffers (or the ring; over
        # shm a large message is pulled from this process, which is gone), the rest never leaves.
        # (Resuming it before dying let the shm receiver pull the whole message on an idle host.)
        os.kill(receiver_pid, signal.SIGSTOP)
        subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -CONT {receiver_pid}"], start_new_session=True)
        try:
            ep.isend(np.ones(64 << 20, np.uint8), peer, tag=1)
            time.sleep(0.05)  # the send starts
        finally:
            os._exit(0)  # dies while the 64 MiB message is in flight
    with open(receiver_pid_file + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(receiver_pid_file + ".tmp", receiver_pid_file)
    buffer = np.zeros(64 << 20, np.uint8)
    handle = ep.irecv(buffer, peer, tag=1)
    barrier(ep)
    start = time.monotonic()
    try:
        handle.wait()
        return {"error": "", "seconds": time.monotonic() - start}
    except dicomm.CommError as e:
        return {"error": str(e), "seconds": time.monotonic() - start}


def silent_peer(rank, world, store_dir, transport, args):
    """Rank 0 stops itself for good after setup (it reports nothing); rank 1 reports its pending requests."""
    ep = endpoint(rank, world, store_dir, transport, timeout=args["request_timeout"], connect_timeout=30)
    peer = 1 - rank
    barrier(ep)
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # alive, connections open, never reads or writes again
        return {}
    time.sleep(0.2)
    start = time.monotonic()
    outcome = {}
    for name, handle in (("recv", ep.irecv(bytearray(10), peer,
                                           tag=1)), ("large_send", ep.isend(np.ones(64 << 20, np.uint8), peer, tag=2))):
        try:
            handle.wait()
            outcome[name] = ""
        except dicomm.CommError as e:
            outcome[name] = str(e)
    outcome["seconds"] = time.monotonic() - start
    return outcome


def token(rank, world, store_dir, transport, args):
    started = time.monotonic()
    try:
        ep = endpoint(rank, world, store_dir, transport, token=args["tokens"][rank],
                      connect_timeout=args["connect_timeout"])
    except dicomm.CommError as e:
        return {"error": str(e), "seconds": time.monotonic() - started}
    barrier(ep)
    return {"error": "", "notes": ep.notes}


def echo(rank, world, store_dir, transport, args):
    """rank 0 receives one message from rank 1 and reports it (or the error)."""
    started = time.perf_counter()
    ep = endpoint(rank, world, store_dir, transport, token=args.get("token"), timeout=args.get("request_timeout", 30),
                  connect_timeout=args.get("connect_timeout"))
    setup_s = time.perf_counter() - started
    if rank == 0:
        buffer = bytearray(args.get("capacity", 16))
        try:
            n = ep.recv(buffer, 1, tag=args.get("tag", 0))
            return {"data": bytes(buffer[:n]).decode(), "notes": ep.notes, "error": "", "transport": ep.transport(1)}
        except dicomm.CommError as e:
            return {"error": str(e), "notes": ep.notes}
    ep.send(b"hello", 0, tag=args.get("tag", 0))
    return {"notes": ep.notes, "transport": ep.transport(0), "setup_s": setup_s}


class PidForgingStore(dicomm.FileStore):
    """A FileStore through which this rank announces another process's pid as its own."""

    def __init__(self, path, pid, timeout=30):
        super().__init__(path, timeout=timeout)
        self.forged_pid = pid

    def set(self, key, value):
        if "/peer/" in key:
            text = value.decode() if isinstance(value, bytes) else value
            value = text.replace(f"\npid={os.getpid()}\n", f"\npid={self.forged_pid}\n")
        super().set(key, value)


def map_fixed(address: int, size: int):
    """`size` bytes of fresh anonymous memory at exactly `address` (the shared decoy address)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    map_fixed_noreplace = 0x100000
    got = libc.mmap(address, size, mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | map_fixed_noreplace, -1, 0)
    if got != address:
        raise OSError(ctypes.get_errno(), f"cannot map {size} bytes at {address:#x}")
    return (ctypes.c_uint8 * size).from_address(address)


def forged_pid(rank, world, store_dir, transport, args):
    """rank 1 announces args["decoy_pid"] as its pid and receives a large message into memory at
    args["address"], where the decoy process keeps a canary; rank 0 sends it over shm."""
    size = args["size"]
    if rank == 0:
        try:
            ep = endpoint(rank, world, store_dir, transport, timeout=10)
        except dicomm.CommError as e:
            return {"refused": str(e)}
        ep.send(pattern(size, 3), 1, tag=1)
        barrier(ep)
        return {}
    store = PidForgingStore(store_dir, args["decoy_pid"])
    buffer = np.frombuffer(map_fixed(args["address"], size), np.uint8)
    try:
        ep = dicomm.Endpoint(store, rank, world, transport=transport, timeout=10)
    except dicomm.CommError as e:
        return {"refused": str(e)}
    n = ep.recv(buffer, 0, tag=1)
    barrier(ep)
    return {"transport": ep.transport(0), "intact": n == size and bool((buffer == pattern(size, 3)).all())}


PIDFD_GETFD = 438  # the same number on every Linux architecture (the generic syscall table)


def refuse_pidfd_getfd() -> int:
    """Installs a seccomp filter failing pidfd_getfd with EPERM in this thread and the threads it
    starts later (as Docker's default profile does without CAP_SYS_PTRACE); returns the errno a
    call now gets."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    load_syscall_number, jump_if_equal, ret = 0x20, 0x15, 0x06
    program = b"".join(
        struct.pack("HBBI", *instruction) for instruction in (
            (load_syscall_number, 0, 0, 0),
            (jump_if_equal, 0, 1, PIDFD_GETFD),
            (ret, 0, 0, 0x00050000 | 1),  # SECCOMP_RET_ERRNO | EPERM
            (ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
        ))
    filters = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(filters))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    assert libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) == 0
    assert libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.create_string_buffer(fprog), 0, 0) == 0, \
        os.strerror(ctypes.get_errno())
    libc.syscall(PIDFD_GETFD, -1, 0, 0)
    return ctypes.get_errno()


def echo_refusing_pidfd_getfd(rank, world, store_dir, transport, args):
    """echo, on ranks where the kernel refuses pidfd_getfd."""
    refused_with = refuse_pidfd_getfd()
    return {**echo(rank, world, store_dir, transport, args), "pidfd_getfd_errno": refused_with}


def socket_buffers(rank, world, store_dir, transport, args):
    """The kernel's send and receive buffer sizes (ss's tb and rb) of this rank's connected tcp sockets."""
    import re
    import subprocess
    ep = endpoint(rank, world, store_dir, transport)
    barrier(ep)
    lines = subprocess.run(["ss", "-tmnpH", "state", "established"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    mine = f"pid={os.getpid()},"
    buffers = []
    for line, next_line in zip(lines, lines[1:] + [""]):
        if mine in line:
            # ss prints skmem:(...) on the socket's line or, in most versions, the line below it.
            sizes = dict(re.findall(r"\b(rb|tb)(\d+)", line if "skmem" in line else next_line))
            buffers.append((int(sizes["tb"]), int(sizes["rb"])))
    barrier(ep)
    return {"buffers": buffers}


def tcp_socket_options(rank, world, store_dir, transport, args):
    """Congestion control and not-sent low-water mark of each connected tcp socket of this process."""
    import socket
    ep = endpoint(rank, world, store_dir, transport)
    barrier(ep)
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:  # not a socket
            continue
        with sock:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                sock.getpeername()
            except OSError:  # the listener
                continue
            found.append({
                "congestion": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode(),
                "notsent_lowat": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT)
            })
    barrier(ep)
    return {"sockets": found}


def torch_store_exchange(store, rank, transport):
    ep = dicomm.Endpoint(store, rank, 2, transport=transport, timeout=30)
    peer = 1 - rank
    data = np.arange(1000, dtype=np.float32) * (rank + 1)
    incoming = np.zeros_like(data)
    r = ep.irecv(incoming, peer)
    ep.send(data, peer)
    r.wait()
    ep.close()
    return bool((incoming == np.arange(1000, dtype=np.float32) * (peer + 1)).all())


def torch_store(rank, world, store_dir, transport, args):
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", args["port"], world, is_master=False, timeout=datetime.timedelta(seconds=30))
    return {"ok": torch_store_exchange(store, rank, transport)}


def device_staging(rank, world, store_dir, transport, args):
    """'Device' memory reachable only through copy hooks (counted) is staged through the host."""
    import ctypes

    ep = endpoint(rank, world, store_dir, transport, timeout=30)
    copies = {"to_host": 0, "from_host": 0}

    def hook(name):

        def copy(dst, src, nbytes):
            copies[name] += nbytes
            ctypes.memmove(dst, src, nbytes)

        return copy

    ep.set_copy_hooks(hook("to_host"), hook("from_host"))
    size = (1 << 20) + 3
    device = np.zeros(size, np.uint8)
    address = device.ctypes.data
    if rank == 0:
        device[:] = pattern(size, 5)
        ep.send((address, size), 1, device=True)
        barrier(ep)
        return {"copies": copies}
    n = ep.recv((address, size), 0, device=True)
    barrier(ep)
    return {"copies": copies, "intact": n == size and bool((device == pattern(size, 5)).all())}


def send_and_exit(rank, world, store_dir, transport, args):
    """rank 1 sends messages and exits at once; rank 0 receives them afterwards."""
    ep = endpoint(rank, world, store_dir, transport, timeout=30)
    sizes = args["sizes"]
    if rank == 1:
        for i, size in enumerate(sizes):
            ep.send(pattern(size, i), 0, tag=4)
        os._exit(0)
    time.sleep(0.5)
    received = []
    for i, size in enumerate(sizes):
        buffer = np.zeros(size, np.uint8)
        try:
            received.append(ep.recv(buffer, 1, tag=4) == size and bool((buffer == pattern(size, i)).all()))
        except dicomm.CommError as e:
            received.append(str(e))
    return {"received": received}


def delayed_replies(rank, world, store_dir, transport, args):
    """Rank 1 answers each of rank 0's pings `delay_s` late; rank 0 reports the CPU its process spent
    (all threads: the waiter and the transport's progress thread) against the time it waited."""
    from dicomm import _dicomm_core

    ep = endpoint(rank, world, store_dir, transport)
    barrier(ep)
    message = bytearray(8)
    if rank == 1:
        for index in range(args["pings"]):
            ep.recv(message, 0, index)
            time.sleep(args["delay_s"])
            ep.send(message, 0, index)
        return {}
    cpu, wall = time.process_time(), time.perf_counter()
    for index in range(args["pings"]):
        ep.send(message, 1, index)
        ep.recv(message, 1, index)
    return {
        "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
        "window_us": _dicomm_core.Options.from_environment().active_wait_window_us()
    }


def run(scenario: str, world_size: int = 2, transport: str = "tcp", timeout: float = 120, env=None,
        **args) -> list[dict]:
    """Every rank's findings, in rank order; `env`: extra variables (or a function of the rank giving them)."""
    return run_ranks(globals()[scenario], world_size, (tempfile.mkdtemp(prefix="dicomm-test-"), transport, args),
                     env=env, timeout=timeout)


def start(scenario: str, ranks=None, world_size: int = 2, store_dir: str | None = None, transport: str = "tcp",
          env=None, **args) -> RankJob:
    """Start `ranks` of a scenario (default all) for a test that kills, freezes or impersonates a rank;
    use the job in a `with` block and take findings with job.results(ranks)."""
    return start_ranks(globals()[scenario], world_size,
                       (store_dir or tempfile.mkdtemp(prefix="dicomm-test-"), transport, args), ranks=ranks, env=env)
