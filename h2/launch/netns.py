"""Emulated nodes on one machine: one network namespace per node, joined by veth pairs on a bridge,
with the kernel shaping the bandwidth between every two nodes; torn down on every exit.

Addresses come from the benchmarking range 198.18.0.0/15: node k is 198.18.<100 + k // 100>.<100 + k % 100>
on eth0 inside its namespace, so the addresses' text sorts in node order (torchrun's c10d rendezvous
ranks nodes by address). Each namespace gets an /etc/hosts naming every node (`ip netns exec` mounts
/etc/netns/<namespace>/hosts), so reverse look-ups of peers answer at once. The bridge has no address:
nothing outside the emulated nodes can reach them, so two jobs' networks never meet. Bandwidth: inside
each namespace an htb qdisc on eth0 gives every destination node its own token-bucket class
(`tc ... htb rate`), with a u32 filter on the destination address; this kernel has no netem, so
latency stays in the pacing layers (h2.core.links).

Teardown (processes left in a namespace killed, namespaces and bridge deleted) runs when the `with`
block ends, on an exception, on Ctrl-C and on SIGTERM/SIGHUP. A launcher killed with SIGKILL leaves
its namespaces behind; the next `EmulatedNetwork` removes those whose launcher is gone and that
hold no process. Needs root and iproute2 (`ip`, `tc`): `missing_requirements()` says what is absent.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import Callable

from h2.core.errors import UserError

NETWORK = ipaddress.ip_network("198.18.0.0/15")
INTERFACE = "eth0"
MAX_NODES = 100 * 100
HOSTS_DIR = "/etc/netns"
_NAMESPACE = re.compile(r"^h2n-(\d+)-(\d+)$")


@functools.cache
def missing_requirements() -> list[str]:
    """What this machine lacks for network namespaces, one phrase each; empty when nothing is missing.
    As root with iproute2 it creates and deletes one namespace (a container may forbid it)."""
    missing = []
    if os.geteuid() != 0:
        missing.append(f"not root (uid {os.geteuid()})")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"'{tool}' (iproute2) not found")
    if not missing:
        probe = f"h2n-{os.getpid()}-probe"
        created = _run(["ip", "netns", "add", probe], check=False)
        if created.returncode != 0:
            reason = (created.stderr.strip().splitlines() or ["no reason given"])[0]
            missing.append(f"cannot create a network namespace: {reason}")
        else:
            _run(["ip", "netns", "delete", probe], check=False)
    return missing


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["exit status " + str(done.returncode)])[0]
        raise UserError(f"emulated network: '{' '.join(argv)}' failed: {reason}")
    return done


def list_namespaces() -> list[str]:
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    done = _run(["ip", "netns", "pids", namespace], check=False)
    return [int(pid) for pid in done.stdout.split()]


def node_address(index: int) -> str:
    """Node `index`'s address: fixed-width octets, so the text sorts as the index does."""
    return str(NETWORK[(100 + index // 100) * 256 + 100 + index % 100])


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def remove_stale() -> list[str]:
    """Deletes the namespaces (and bridge) of launchers that died without tearing down, when no
    process is left in them. Returns the namespaces removed."""
    removed = []
    for namespace in list_namespaces():
        match = _NAMESPACE.match(namespace)
        if match and not _alive(int(match.group(1))) and not _pids_in(namespace):
            owner, index = int(match.group(1)), int(match.group(2))
            _run(["ip", "link", "delete", _veth_name(owner, index)], check=False)
            _run(["ip", "netns", "delete", namespace], check=False)
            _run(["ip", "link", "delete", _bridge_name(owner)], check=False)
            shutil.rmtree(os.path.join(HOSTS_DIR, namespace), ignore_errors=True)
            removed.append(namespace)
    return removed


def _bridge_name(owner: int) -> str:
    return f"h2b{owner}"


def _veth_name(owner: int, index: int) -> str:
    """The host end of node `index`'s veth pair (interface names have at most 15 characters)."""
    return f"h2v{owner}n{index}"


@dataclass(frozen=True)
class EmulatedNode:
    index: int
    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def environment(self) -> dict[str, str]:
        """Variables for processes on this node: gloo binds its interface, and DiComm advertises its
        address and treats it as a host of its own (tcp to other nodes, not shared memory)."""
        return {
            "GLOO_SOCKET_IFNAME": INTERFACE, "DICOMM_ADVERTISE_ADDR": self.address, "DICOMM_HOST_ID": self.namespace
        }


class EmulatedNetwork:
    """`with EmulatedNetwork(n, bandwidth) as nodes:` n namespaces on one bridge; `bandwidth(i, j)` is
    the bytes per second from node i to node j (None: not shaped)."""

    def __init__(self, count: int, bandwidth: Callable[[int, int], float | None] = lambda i, j: None):
        if not 1 <= count <= MAX_NODES:
            raise UserError(f"emulated network: {count} nodes; between 1 and {MAX_NODES} can be emulated")
        missing = missing_requirements()
        if missing:
            raise UserError(f"emulated network needs root and iproute2: {'; '.join(missing)}")
        self.owner = os.getpid()
        self.bridge = _bridge_name(self.owner)
        self.nodes = [EmulatedNode(k, f"h2n-{self.owner}-{k}", node_address(k)) for k in range(count)]
        self._bandwidth = bandwidth
        self._previous_handlers: dict[int, object] = {}
        self._namespaces: list[str] = []
        self._veths: list[str] = []
        self._bridge_created = False

    # ---- lifetime ------------------------------------------------------------------------------
    def __enter__(self) -> list[EmulatedNode]:
        remove_stale()
        self._catch_termination()
        try:
            self._create()
        except BaseException:
            self.teardown()
            raise
        return self.nodes

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _catch_termination(self) -> None:
        """SIGTERM and SIGHUP end the `with` block like an exception, so the teardown runs."""
        if threading.current_thread() is not threading.main_thread():
            return

        def terminate(signum, frame):
            raise SystemExit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[signum] = signal.signal(signum, terminate)

    def teardown(self) -> None:
        """Kills what still runs in the namespaces, deletes the veth pairs, the namespaces and the
        bridge. Idempotent."""
        for namespace in self._namespaces:
            for pid in _pids_in(namespace):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for veth in self._veths:  # deleting one end removes the pair at once (a namespace's go later)
            _run(["ip", "link", "delete", veth], check=False)
        for namespace in self._namespaces:
            _run(["ip", "netns", "delete", namespace], check=False)
            shutil.rmtree(os.path.join(HOSTS_DIR, namespace), ignore_errors=True)
        if self._bridge_created:
            _run(["ip", "link", "delete", self.bridge], check=False)
        self._namespaces, self._veths, self._bridge_created = [], [], False
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    # ---- setup ---------------------------------------------------------------------------------
    def _create(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._bridge_created = True
        _run(["ip", "link", "set", self.bridge, "up"])
        for node in self.nodes:
            host_end = _veth_name(self.owner, node.index)
            _run(["ip", "netns", "add", node.namespace])
            self._namespaces.append(node.namespace)
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", INTERFACE, "netns", node.namespace])
            self._veths.append(host_end)
            _run(["ip", "link", "set", host_end, "master", self.bridge])
            _run(["ip", "link", "set", host_end, "up"])
            _run(["ip", "-n", node.namespace, "addr", "add", f"{node.address}/{NETWORK.prefixlen}", "dev", INTERFACE])
            _run(["ip", "-n", node.namespace, "link", "set", INTERFACE, "up"])
            _run(["ip", "-n", node.namespace, "link", "set", "lo", "up"])
        for node in self.nodes:
            self._write_hosts(node)
            self._shape(node)

    def _write_hosts(self, node: EmulatedNode) -> None:
        folder = os.path.join(HOSTS_DIR, node.namespace)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hosts"), "w", encoding="utf-8") as hosts:
            hosts.write("127.0.0.1 localhost\n::1 localhost\n")
            for peer in self.nodes:  # IPv4, and as IPv6 sockets see it
                hosts.write(f"{peer.address} {peer.namespace}\n::ffff:{peer.address} {peer.namespace}\n")

    def _shape(self, node: EmulatedNode) -> None:
        """An htb class per destination node, at the link's rate (unclassified traffic is not shaped)."""
        tc = ["tc", "-n", node.namespace]
        rates = {peer.index: self._bandwidth(node.index, peer.index) for peer in self.nodes if peer is not node}
        if all(rate is None for rate in rates.values()):
            return
        _run(tc + ["qdisc", "add", "dev", INTERFACE, "root", "handle", "1:", "htb"])
        for peer in self.nodes:
            rate = rates.get(peer.index)
            if rate is None:
                continue
            bits = max(8, int(rate * 8))
            burst = max(16 * 1024, int(rate * 1e-3))  # one millisecond of traffic
            classid = f"1:{peer.index + 10:x}"
            _run(tc + [
                "class", "add", "dev", INTERFACE, "parent", "1:", "classid", classid, "htb", "rate", f"{bits}bit",
                "ceil", f"{bits}bit", "burst",
                str(burst), "cburst",
                str(burst)
            ])
            _run(tc + [
                "filter", "add", "dev", INTERFACE, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
                "dst", f"{peer.address}/32", "flowid", classid
            ])

    def describe(self) -> str:
        first, last = self.nodes[0], self.nodes[-1]
        return (f"{len(self.nodes)} network namespaces {first.namespace}..{last.namespace.rsplit('-', 1)[1]} "
                f"({first.address}..{last.address}) on bridge {self.bridge}")
