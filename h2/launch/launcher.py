"""Starting a pipeline job's ranks: one local torchrun (`--standalone`), or, for a cluster whose
ranks sit on several nodes, one torchrun per emulated node, each in its own network namespace
(h2.launch.netns), meeting through torchrun's multi-node rendezvous (`--nnodes`, `--rdzv-backend c10d`,
`--rdzv-endpoint`), so torchrun, gloo and DiComm's TCP cross real (veth) interfaces.

The rendezvous store is served by a small process of its own in node 0's namespace, which outlives
every node's torchrun (a store inside node 0's torchrun would vanish while the other nodes still
pass its exit barrier). Nodes join with their own address (`--local-addr`); the rendezvous ranks
nodes by it, and node k's address sorts k-th (h2.launch.netns), so node k holds the k-th block of
global ranks, as the strategy's placement says.

Without root or iproute2 every node's ranks run on loopback; the link pacing of h2.core.links still
applies (P2P for gloo, DiComm's shaping layer), and one line says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from h2.core import scratch
from h2.core.cluster import ClusterSpec
from h2.core.errors import UserError
from h2.core.links import Location, link_between, nodes_of, rank_locations
from h2.core.ranks import STALE_RANK_FOLDERS
from h2.core.strategy import Strategy
from h2.launch import netns
from h2.launch.contract import FAILURES_PREFIX, KERNEL_SHAPED_ENV, job_finished, rank_names
from h2.launch.exit_watch import ExitWatch, Stall

RENDEZVOUS_PORT = 29500
_STOP_GRACE_S = 10.0
JOB_FOLDER_PREFIX = "h2-job-"
# How long the job's torchrun may take to stop its ranks after the launcher was stopped (torchrun
# gives its ranks 30 s after a SIGTERM before it kills them).
_JOB_STOP_GRACE_S = 45.0
EXIT_STALL_S = 300.0  # a finished job's process without progress for this long is hung (the job passes --rank-timeout)


def rank_command(nproc: int, job_path: str, rendezvous: list[str], max_restarts: int = 0, node: int = 0) -> list[str]:
    """torchrun (through h2.launch.agent, which writes the ranks' failures to `failures-<node>.json`
    beside the job file) restarts every rank of the job up to `max_restarts` times after one fails.
    Its log folder is made beside the job file (the launcher removes both; torchrun's default, a
    `torchelastic_*` folder in TMPDIR, is never removed)."""
    job_folder = os.path.dirname(job_path)
    log_dir = os.path.join(job_folder, "torchrun")
    failures = os.path.join(job_folder, f"{FAILURES_PREFIX}{node}.json")
    return [
        sys.executable, "-m", "h2.launch.agent", failures, *rendezvous, "--nproc-per-node",
        str(nproc), "--max-restarts",
        str(max_restarts), "--log-dir", log_dir, "-m", "h2.cli.rank", "--job", job_path
    ]


def launch(strategy: Strategy, cluster: ClusterSpec | None, job_path: str, source: str,
           hosts: tuple[int, str] | None = None, max_restarts: int = 0, stall_s: float = EXIT_STALL_S) -> int:
    """Runs the job's ranks until they finish; returns the exit status (the first failure's). With
    `hosts` = (N, HOST:PORT) this host runs 1/N of the ranks and meets the other hosts' torchruns at
    that rendezvous endpoint (torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT).
    torchrun restarts every rank up to `max_restarts` times after one fails. A rank that died by a
    signal is named in one line (h2.launch.agent's failures). `stall_s`: the exit watch's timeout (the job's
    --rank-timeout; run_until_ranks_exit).

    Stopped itself (SIGINT, SIGTERM, SIGHUP; h2.launch.launcher.job_folder turns the last two into
    `Stopped`), it stops the job's torchrun (SIGTERM) and waits for it to stop its ranks before it
    returns through the caller's clean-up: a SIGTERM or SIGHUP ends the process with 128 + the signal."""
    try:
        status = _launch(strategy, cluster, job_path, source, hosts, max_restarts, stall_s)
    except KeyboardInterrupt:
        _stop_children()
        raise
    except Stopped as stopped:
        _stop_children()
        raise SystemExit(128 + stopped.signum) from None
    if status != 0:
        report_rank_deaths(strategy, os.path.dirname(job_path))
    return status


def report_rank_deaths(strategy: Strategy, job_folder: str) -> None:
    """One line for each rank that a signal ended (a rank that fails by itself, or that torchrun
    stopped with SIGTERM once another had failed, has said why already): which rank, stage and chip,
    which signal, and whether the job had finished (every rank past the final barrier) by then."""
    from h2.launch.agent import read_failures

    folder = job_folder or "."
    exit_codes: dict[int, int] = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith(FAILURES_PREFIX) and name.endswith(".json"):
            exit_codes.update(read_failures(os.path.join(folder, name)))
    deaths = {rank: -code for rank, code in exit_codes.items() if code < 0 and -code != signal.SIGTERM}
    if not deaths:
        return
    describe = _rank_describer(strategy)
    when = (" after the job finished (every rank had reached the final barrier): the run's checkpoints and "
            "metrics are complete" if job_finished(folder) else "")
    for rank, signum in sorted(deaths.items()):
        print(f"h2: error: {describe(rank)} died (killed by {_signal_name(signum)}){when}", file=sys.stderr, flush=True)


def _rank_describer(strategy: Strategy):
    """rank -> 'rank 1 (stage 1, chip B)'."""
    from heteropp.topology import Topology

    return rank_names(Topology.from_strategy(strategy))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _launch(strategy: Strategy, cluster: ClusterSpec | None, job_path: str, source: str, hosts: tuple[int, str] | None,
            max_restarts: int, stall_s: float) -> int:
    if hosts is not None and hosts[0] > 1:
        count, endpoint = hosts
        if strategy.world_size % count:
            raise UserError(f"{source}: {strategy.world_size} ranks do not split evenly over --nnodes {count}")
        rendezvous = [
            "--nnodes",
            str(count), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
            "h2-" + os.path.basename(source)
        ]
        return start_child(rank_command(strategy.world_size // count, job_path, rendezvous, max_restarts)).wait()
    nodes = nodes_of(rank_locations(strategy, cluster, source)) if cluster is not None else []
    standalone = rank_command(strategy.world_size, job_path, ["--standalone"], max_restarts)
    if len(nodes) <= 1:
        return run_until_ranks_exit(standalone, strategy, os.path.dirname(job_path), stall_s)
    missing = netns.missing_requirements()
    if missing:
        print(
            f"h2: {len(nodes)} emulated nodes on loopback, not network namespaces ({'; '.join(missing)}): "
            f"links paced by the pacing layers only", flush=True)
        return run_until_ranks_exit(standalone, strategy, os.path.dirname(job_path), stall_s)
    locations = [location for location, _ in nodes]

    def bandwidth(i: int, j: int) -> float:
        return link_between(cluster, locations[i], locations[j])[1].bytes_per_s

    network = netns.EmulatedNetwork(len(nodes), bandwidth)
    with network as emulated:
        print(
            f"h2: {len(nodes)} emulated nodes in {network.describe()}; bandwidth between nodes shaped by the "
            f"kernel (tc htb), latency by the pacing layers; {describe_nodes(nodes)}", flush=True)
        return _run_nodes(emulated, [ranks for _, ranks in nodes], job_path, max_restarts)


def run_until_ranks_exit(command: list[str], strategy: Strategy, job_folder: str, stall_s: float = EXIT_STALL_S) -> int:
    """Runs torchrun's `command` until it ends; returns its status. Once a rank has passed the final
    barrier (its mark in `job_folder`), every rank has done its work and the exit watch (h2.launch.exit_watch)
    follows the processes still running by their progress: one whose CPU time has not moved for `stall_s`
    seconds (stopped, or hung while exiting: torchrun would wait for it forever) is named in one line and
    killed with the job, and the status is 1. Processes that progress are waited for, however busy the host."""
    process = start_child(command)
    watch = None
    while True:
        try:
            return process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if watch is None:
            if job_finished(job_folder):
                watch = ExitWatch(stall_s)
            continue
        stalls = watch.observe(_exiting_processes(process.pid, strategy))
        if stalls:
            _kill_stalled(process, stalls, stall_s)
            return 1


def _exiting_processes(root: int, strategy: Strategy) -> dict[str, int]:
    """What a finished job still runs, by name: its rank processes; torchrun itself once none is left."""
    describe = _rank_describer(strategy)
    ranks = {describe(rank): pid for rank, pid in sorted(_rank_processes(root).items())}
    return ranks or {f"torchrun (pid {root})": root}


def _kill_stalled(process: subprocess.Popen, stalls: list[Stall], stall_s: float) -> None:
    for pid in [*_rank_processes(process.pid).values(), process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    names = ", ".join(f"{stall.name} ({stall.why()})" for stall in stalls)
    print(
        f"h2: error: {names} stopped responding after the job finished (no progress for {stall_s:g} s after "
        f"the final barrier); killed. The run's checkpoints and metrics are complete", file=sys.stderr, flush=True)


def descendants(root: int) -> list[int]:
    """Every process under `root` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                children.setdefault(int(handle.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except OSError:
            continue
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _rank_processes(root: int) -> dict[int, int]:
    """RANK -> pid of the rank processes under `root` (torchrun's workers)."""
    ranks = {}
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"RANK" in environ and b"TORCHELASTIC_RUN_ID" in environ:
            ranks[int(environ[b"RANK"])] = pid
    return ranks


def describe_nodes(nodes: list[tuple[Location, list[int]]]) -> str:
    return ", ".join(f"node {k} = {location.describe()} (emulated) ranks {ranks[0]}..{ranks[-1]}"
                     for k, (location, ranks) in enumerate(nodes))


def _run_nodes(emulated: list[netns.EmulatedNode], ranks: list[list[int]], job_path: str, max_restarts: int) -> int:
    endpoint = f"{emulated[0].address}:{RENDEZVOUS_PORT}"
    store = subprocess.Popen(
        emulated[0].command([sys.executable, "-c", _STORE_SERVER, emulated[0].address,
                             str(RENDEZVOUS_PORT)]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    processes = []
    try:
        if store.stdout.readline().strip() != "ready":
            raise UserError(f"the rendezvous store at {endpoint} in {emulated[0].namespace} did not start")
        for node, node_ranks in zip(emulated, ranks):
            rendezvous = [
                "--nnodes",
                str(len(emulated)), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                f"h2-{os.getpid()}", "--rdzv-conf", "is_host=false", "--local-addr", node.address
            ]
            env = {**os.environ, **node.environment(), KERNEL_SHAPED_ENV: "1"}
            processes.append(
                subprocess.Popen(
                    node.command(rank_command(len(node_ranks), job_path, rendezvous, max_restarts,
                                              node=len(processes))), env=env, start_new_session=True,
                    preexec_fn=_die_with_parent))
        return _wait_all(processes)
    finally:
        _stop(processes)
        with contextlib.suppress(BrokenPipeError):
            store.stdin.write("stop\n")  # the store server exits at once (at end of input alone it lingers)
            store.stdin.close()
        try:
            store.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _stop([store])


# Serves a TCPStore at argv[1]:argv[2] until the launcher writes "stop"; when its standard input ends
# without it (the launcher died), it serves on while the nodes' torchruns, sent SIGTERM by the kernel
# as the launcher died, stop their ranks (a store gone first makes them fail with C++ stack traces).
_STORE_SERVER = f"""\
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=True, wait_for_workers=False, timeout=timedelta(hours=1))
print("ready", flush=True)
if sys.stdin.readline().strip() != "stop":
    time.sleep({_JOB_STOP_GRACE_S})
"""


def _wait_all(processes: list[subprocess.Popen]) -> int:
    """The first non-zero exit status (the others are stopped then), else 0."""
    while True:
        statuses = [process.poll() for process in processes]
        failed = [status for status in statuses if status not in (None, 0)]
        if failed:
            return failed[0]
        if all(status == 0 for status in statuses):
            return 0
        time.sleep(0.1)


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGINT to each node's torchrun (it stops its ranks), SIGKILL after a grace period."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        _signal_group(process, signal.SIGINT)
    deadline = time.monotonic() + _STOP_GRACE_S
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:  # already gone
        pass


# ---- the job's folder, its processes and the signals that stop the launcher --------------------------
class Stopped(BaseException):
    """The launcher received SIGTERM or SIGHUP (raised by the handler `job_folder` installs)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {_signal_name(signum)}")
        self.signum = signum


_CHILDREN: list[subprocess.Popen] = []


def _die_with_parent() -> None:
    """In a child before it runs its command: SIGTERM when the launcher dies, even by SIGKILL."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start_child(command: list[str]) -> subprocess.Popen:
    """Start a job's torchrun in a process group of its own (a Ctrl-C reaches the launcher only, which
    stops it: a SIGINT in the middle of its start-up would be a traceback); the launcher stops it when
    stopped itself, and the kernel sends it SIGTERM if the launcher dies without a chance to (SIGKILL)."""
    process = subprocess.Popen(command, process_group=0,
                               preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    _CHILDREN.append(process)
    return process


def _stop_children() -> None:
    """SIGTERM to every running torchrun this launcher started (torchrun stops its ranks; a process
    still starting up ends without a traceback), wait for each; one that does not end within
    _JOB_STOP_GRACE_S is killed with its ranks."""
    running = [process for process in _CHILDREN if process.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _JOB_STOP_GRACE_S
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for pid in [*_rank_processes(process.pid).values(), process.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()
    _CHILDREN[:] = [process for process in _CHILDREN if process.poll() is None]


def _raise_stopped(signum: int, _frame) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def job_folder():
    """A fresh folder in TMPDIR for the job file and torchrun's logs, removed when the job ends however
    it ends: SIGTERM and SIGHUP raise `Stopped` meanwhile (the launcher stops its torchrun, then the
    folder goes), and a folder whose launcher was SIGKILLed is removed by the next launcher's start."""
    remove_stale_job_folders()
    folder = scratch.owned_folder(JOB_FOLDER_PREFIX)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {signum: signal.signal(signum, _raise_stopped) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield folder
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale_job_folders(root: str | None = None) -> list[str]:
    """Remove the job folders in `root` (TMPDIR) whose launcher is gone (killed before it could remove
    its own), and the rank jobs' folders of processes that are gone likewise; returns them. A folder
    without an owner record is left alone."""
    return scratch.remove_stale((JOB_FOLDER_PREFIX, *STALE_RANK_FOLDERS), root)
