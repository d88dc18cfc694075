"""Emulated nodes in network namespaces (h2.launch.netns): a torchrun rendezvous across them, kernel
bandwidth shaping, and a teardown that leaves nothing behind on every exit."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from h2.launch import netns

MISSING = netns.missing_requirements()
pytestmark = pytest.mark.skipif(bool(MISSING),
                                reason=f"network namespaces need root and iproute2: {'; '.join(MISSING)}")

WORKER = textwrap.dedent("""
    import os, socket, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} sum {int(total.item())}", flush=True)
    dist.destroy_process_group()
""")


def leftovers(owner: int) -> list[str]:
    """Namespaces and interfaces of launcher `owner` still present."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    return ([ns for ns in netns.list_namespaces() if ns.startswith(f"h2n-{owner}-")] +
            [name for name in names if name in (f"h2b{owner}", ) or name.startswith(f"h2v{owner}n")])


def tx_bytes(node: netns.EmulatedNode) -> int:
    return int(
        subprocess.run(node.command(["cat", f"/sys/class/net/{netns.INTERFACE}/statistics/tx_bytes"]),
                       capture_output=True, text=True, check=True).stdout)


def test_a_two_node_torchrun_rendezvous_runs_across_the_namespaces_veth_links(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with netns.EmulatedNetwork(2) as nodes:
        before = [tx_bytes(node) for node in nodes]
        endpoint = f"{nodes[0].address}:29500"
        runs = [
            subprocess.Popen(
                node.command([
                    sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
                    str(node.index), "--nproc-per-node", "1", "--rdzv-backend", "static", "--rdzv-endpoint", endpoint,
                    str(script)
                ]), env={**os.environ, **node.environment()}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True) for node in nodes
        ]
        outputs = [run.communicate(timeout=240)[0] for run in runs]
        sent = [tx_bytes(node) - b for node, b in zip(nodes, before)]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert "rank 0 sum 3" in outputs[0] and "rank 1 sum 3" in outputs[1]
    assert min(sent) > 1000  # the rendezvous and the all-reduce crossed eth0, not loopback


def test_the_kernel_shapes_the_bandwidth_between_two_nodes():
    rate = 2e6  # bytes per second
    payload = 1_000_000
    server = ("import socket; s = socket.socket(); s.bind(('0.0.0.0', 5001)); s.listen(); c, _ = s.accept(); n = 0\n"
              "while (d := c.recv(1 << 16)): n += len(d)\nprint(n)")
    with netns.EmulatedNetwork(2, lambda i, j: rate) as nodes:
        receiver = subprocess.Popen(nodes[1].command([sys.executable, "-c", server]), stdout=subprocess.PIPE, text=True)
        client = (
            f"import socket, time\nfor _ in range(100):\n  try: s = socket.create_connection(('{nodes[1].address}', "
            f"5001)); break\n  except OSError: time.sleep(0.05)\nt = time.monotonic(); s.sendall(bytes({payload})); "
            f"s.close(); print(time.monotonic() - t)")
        started = time.monotonic()
        subprocess.run(nodes[0].command([sys.executable, "-c", client]), check=True, capture_output=True, timeout=60)
        received = int(receiver.communicate(timeout=60)[0])
        elapsed = time.monotonic() - started
    assert received == payload
    assert elapsed >= 0.5 * payload / rate  # loose: unshaped, a megabyte crosses a veth in milliseconds


def test_the_network_is_torn_down_when_the_block_ends():
    with netns.EmulatedNetwork(2):
        assert len(leftovers(os.getpid())) == 5  # bridge, two namespaces, two veth ends
    assert leftovers(os.getpid()) == []


def test_the_network_is_torn_down_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with netns.EmulatedNetwork(2):
            raise RuntimeError("a rank failed")
    assert leftovers(os.getpid()) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_the_network_is_torn_down_when_the_launcher_is_interrupted(signum):
    holder = subprocess.Popen([
        sys.executable, "-c", "import time\nfrom h2.launch.netns import EmulatedNetwork\n"
        "with EmulatedNetwork(2):\n    print('up', flush=True)\n    time.sleep(120)"
    ], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "up"
    assert len(leftovers(holder.pid)) == 5
    holder.send_signal(signum)
    holder.wait(timeout=60)
    assert leftovers(holder.pid) == []


def test_namespaces_of_a_launcher_killed_outright_are_removed_by_the_next_network():
    holder = subprocess.Popen([
        sys.executable, "-c", "import time\nfrom h2.launch.netns import EmulatedNetwork\n"
        "with EmulatedNetwork(2):\n    print('up', flush=True)\n    time.sleep(120)"
    ], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "up"
    holder.kill()
    holder.wait(timeout=60)
    with netns.EmulatedNetwork(1):
        assert leftovers(holder.pid) == []


DICOMM_PEER = textwrap.dedent("""
    import sys, dicomm
    rank = int(sys.argv[1])
    with dicomm.Endpoint(dicomm.FileStore(sys.argv[2]), rank, 2, connect_timeout=60) as endpoint:
        buffer = bytearray(5)
        if rank == 0:
            endpoint.send(b"hello", 1, tag=1)
        else:
            endpoint.recv(buffer, 0, tag=1)
        print(endpoint.transport(1 - rank), bytes(buffer).decode() if rank else "", flush=True)
""")


def test_dicomm_between_two_nodes_picks_tcp_over_their_veth_link(tmp_path):
    script = tmp_path / "peer.py"
    script.write_text(DICOMM_PEER)
    with netns.EmulatedNetwork(2) as nodes:
        before = tx_bytes(nodes[0])
        peers = [
            subprocess.Popen(node.command([sys.executable, str(script),
                                           str(node.index), str(tmp_path)]), env={**os.environ, **node.environment()},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in nodes
        ]
        outputs = [peer.communicate(timeout=120)[0] for peer in peers]
        sent = tx_bytes(nodes[0]) - before
    assert [line.split()
            for line in (o.strip().splitlines()[-1] for o in outputs)] == [["tcp"], ["tcp", "hello"]], outputs
    assert sent > 0


DICOMM_CONGESTION = textwrap.dedent("""
    import os, socket, sys, dicomm
    rank = int(sys.argv[1])
    with dicomm.Endpoint(dicomm.FileStore(sys.argv[2]), rank, 2, connect_timeout=60) as endpoint:
        found = []
        for name in os.listdir("/proc/self/fd"):
            try:
                sock = socket.socket(fileno=os.dup(int(name)))
            except OSError:
                continue
            with sock:
                try:
                    sock.getpeername()
                except OSError:
                    continue
                if sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET:
                    found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\\0").decode())
        endpoint.send(b"x", 1 - rank, tag=1)
        endpoint.recv(bytearray(1), 1 - rank, tag=1)
        print(" ".join(sorted(set(found))), flush=True)
""")


def test_dicomm_tcp_to_another_node_keeps_the_kernels_congestion_control(tmp_path):
    # Reno is chosen for peers on this host only (docs/dicomm.md, tcp): a path between hosts keeps
    # what the administrator set, since reno recovers slowly from a loss on a long path.
    script = tmp_path / "congestion.py"
    script.write_text(DICOMM_CONGESTION)
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as default:
        kernel_default = default.read().strip()
    if kernel_default == "reno":
        pytest.skip("the kernel's default is reno: the two choices cannot be told apart")
    with netns.EmulatedNetwork(2) as nodes:
        peers = [
            subprocess.Popen(node.command([sys.executable, str(script),
                                           str(node.index), str(tmp_path)]), env={**os.environ, **node.environment()},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in nodes
        ]
        outputs = [peer.communicate(timeout=120)[0] for peer in peers]
    assert [o.strip().splitlines()[-1] for o in outputs] == [kernel_default] * 2, outputs
