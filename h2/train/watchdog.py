"""Rank loss: every rank of a pipeline job watches the others, so that a rank that dies or stops
responding makes every other rank stop within a timeout, each with one line naming the lost rank,
its stage and its chip (without it they would wait in a collective that can never complete).

Through the job's TCP store (MASTER_ADDR:MASTER_PORT: torchrun's agent store, or the one rank 0
hosts), a thread of each rank's own
  - registers the rank's process (host and pid), then bumps its heartbeat counter every
    `timeout / 10` s: a rank blocked in a collective still beats, a dead or frozen one does not;
  - reads every peer's counter: a peer whose counter has not moved for `timeout` s, measured on this
    rank's clock, stopped responding;
  - sees at once that a peer on the same host died (its process is gone);
  - repeats what another rank reported first (`report`: a rank that fails by itself, or that
    found a lost peer, posts one line, which every other rank then gives as its reason to stop).
A loss ends the rank at once: its line on stderr, exit status 1, through os._exit (the main thread
may be blocked in a collective that will never return). SIGTERM, which torchrun sends to the other
ranks once one of them has failed, is handled by the same thread: the rank names the loss if it
knows it, else says it was stopped.

Keys live under `h2/watch/<attempt>/` (torchrun's restart count), so a restarted job starts clean.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Callable

EXIT_RANK_LOST = 1
EXIT_STOPPED = 128 + signal.SIGTERM


def host_identity() -> str:
    """Processes with the same identity see each other's pids: same boot, same pid namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot = handle.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return f"unknown:{os.getpid()}"  # never equal to another process's: no pid checks


def _process_start(pid: int) -> str | None:
    """The start time of live process `pid` (field 22 of /proc/PID/stat), None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    state, start = fields[0], fields[19]
    return None if state in ("Z", "X", "x") else start


def stop_process(line: str, code: int) -> None:
    """Print `line` on stderr and end the process now, whatever its other threads are doing."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001  (a closed stdout must not keep the process alive)
        pass
    os.write(2, (line.rstrip("\n") + "\n").encode(errors="replace"))
    os._exit(code)


class RankWatchdog:

    def __init__(self, store, rank: int, world_size: int, *, timeout_s: float, describe: Callable[[int], str],
                 attempt: int = 0, prog: str = "h2.cli.rank", on_loss: Callable[[str, int], None] = stop_process):
        """`store`: a client of the job's store; `describe(rank)` names a rank ('rank 1 (stage 1, chip B)');
        `on_loss(line, exit_code)` ends the rank (default: print and exit)."""
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s, self.describe, self.prog, self.on_loss = timeout_s, describe, prog, on_loss
        self.interval_s = min(1.0, max(0.05, timeout_s / 10))
        self.prefix = f"h2/watch/{attempt}/"
        self.host = host_identity()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the watching thread and a failing main thread both look for a loss
        self._thread: threading.Thread | None = None
        self._wakeup: tuple[int, int] | None = None
        self._previous_sigterm = None
        self._processes: dict[int, tuple[int, str]] = {}  # local peers: pid, start time
        self._beats: dict[int, tuple[int, float]] = {}  # peer: last counter, when it last moved

    @classmethod
    def connect(cls, rank: int, world_size: int, **kwargs) -> "RankWatchdog":
        """A watchdog with its own client of the store at MASTER_ADDR:MASTER_PORT."""
        import torch.distributed as dist

        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=max(10.0, kwargs["timeout_s"])))
        return cls(store, rank, world_size, **kwargs)

    def _key(self, *parts) -> str:
        return self.prefix + "/".join(str(part) for part in parts)

    # ---- lifecycle (main thread) -----------------------------------------------------------
    def start(self) -> "RankWatchdog":
        start = _process_start(os.getpid()) or "?"
        self.store.set(self._key("process", self.rank), f"{self.host} {os.getpid()} {start}")
        self.store.add(self._key("beat", self.rank), 1)
        if threading.current_thread() is threading.main_thread():
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
            self._wakeup = (read_end, write_end)
            self._previous_sigterm = signal.signal(signal.SIGTERM, lambda signum, frame: None)
            signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="h2-rank-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (this rank finished): the others no longer expect its heartbeat."""
        if self._thread is None:
            return
        self._stop.set()
        with self._lock:
            self.store.set(self._key("done", self.rank), "1")
        if self._wakeup is not None:
            try:
                os.write(self._wakeup[1], b"\0")  # the thread waits on this pipe: it ends now, not a beat later
            except BlockingIOError:
                pass  # full: the thread has bytes to wake up to already
        self._thread.join()
        self._thread = None
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def stop_on_loss(self, within_s: float) -> None:
        """This rank's collective failed: if a lost peer is found within `within_s` seconds, end the
        rank with its line; return otherwise (the failure is this rank's own)."""
        deadline = time.monotonic() + within_s + self.interval_s
        while True:
            try:
                loss = self.find_loss()
            except Exception:  # noqa: BLE001  (no store: nothing more to learn)
                return
            if loss:
                self._end(loss)
                return
            if time.monotonic() > deadline:
                return
            time.sleep(self.interval_s)

    def report(self, line: str) -> None:
        """Post why the job is ending (kept only if no rank posted first); the others repeat it."""
        try:
            self.store.compare_set(self._key("lost"), "", line)
        except Exception:  # noqa: BLE001  (the store may be gone with its host; the rank ends anyway)
            pass

    # ---- the watching thread ---------------------------------------------------------------
    def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                if self._wait_for_sigterm(self.interval_s):
                    self._stopped_by_sigterm()
                if self._stop.is_set():
                    return
                with self._lock:
                    self.store.add(self._key("beat", self.rank), 1)
                loss = self.find_loss()
                if loss:
                    self._end(loss)
        except Exception as error:  # noqa: BLE001  (the store went away: its host process ended)
            if not self._stop.is_set():
                self._end(f"the job's store at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                          f"is gone ({type(error).__name__}), so is the process that hosted it")

    def _wait_for_sigterm(self, seconds: float) -> bool:
        if self._wakeup is None:
            self._stop.wait(seconds)
            return False
        readable, _, _ = select.select([self._wakeup[0]], [], [], seconds)
        if not readable:
            return False
        try:
            received = os.read(self._wakeup[0], 64)
        except BlockingIOError:
            return False
        return signal.SIGTERM in received

    def _stopped_by_sigterm(self) -> None:
        loss = self.find_loss(heartbeats=False)
        if loss:
            self._end(loss)
        self.on_loss(f"{self.prog}: error: {self.describe(self.rank)} was stopped (SIGTERM)", EXIT_STOPPED)
        self._stop.set()

    def _end(self, loss: str) -> None:
        self.report(loss)
        self.on_loss(f"{self.prog}: error: {loss}; {self.describe(self.rank)} stops", EXIT_RANK_LOST)
        self._stop.set()

    def _done(self, peer: int) -> bool:
        return self.store.check([self._key("done", peer)])

    def _reported(self) -> str | None:
        key = self._key("lost")
        if self.store.check([key]):
            line = self.store.get(key).decode(errors="replace")
            return line or None
        return None

    def find_loss(self, heartbeats: bool = True) -> str | None:
        """One line naming a lost peer, or None: what another rank reported, a local peer whose
        process is gone, or (with `heartbeats`) a peer silent for longer than the timeout."""
        with self._lock:
            return self._find_loss(heartbeats)

    def _find_loss(self, heartbeats: bool) -> str | None:
        dead = self._dead_local_peer()
        reported = self._reported()  # read after the process check: a rank reports before it exits
        if reported:
            return reported
        if dead is not None:
            return f"{self.describe(dead)} died (its process ended)"
        if heartbeats:
            silent = self._silent_peer()
            if silent is not None:
                return (f"{self.describe(silent)} stopped responding (no heartbeat for "
                        f"{self.timeout_s:g} s: hung, frozen or cut off)")
        return None

    def _dead_local_peer(self) -> int | None:
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            if peer not in self._processes:
                key = self._key("process", peer)
                if not self.store.check([key]):
                    continue
                host, pid, start = self.store.get(key).decode().split(" ")
                if host != self.host:
                    self._processes[peer] = (-1, "")
                    continue
                self._processes[peer] = (int(pid), start)
            pid, start = self._processes[peer]
            if pid > 0 and _process_start(pid) != start and not self._done(peer):
                return peer
        return None

    def _silent_peer(self) -> int | None:
        now = time.monotonic()
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            count = self.store.add(self._key("beat", peer), 0)
            last = self._beats.get(peer)
            if last is None or count != last[0]:
                self._beats[peer] = (count, now)
            elif now - last[1] > self.timeout_s and not self._done(peer):
                return peer
        return None
