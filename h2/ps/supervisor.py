"""The local launcher's process keeper: named child processes, their logs, fault injection by SIGKILL
at a chosen second, and restarts (what a cluster scheduler such as Kubernetes does for the master
and the shards in the paper's deployment).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: str | None  # None: inherit the launcher's stdout (the master's console lines)
    restart_argv: Callable[[], list[str]] | None  # how it restarts after an unexpected exit (None: never)
    restart_delay_s: float = 0.0
    process: subprocess.Popen | None = None
    starts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    restart_at: float | None = None
    reaped: bool = False  # this process's exit was noticed


MAX_RESTARTS = 10
BAD_INPUT = 2  # a child that refused its input will refuse it again: it is not restarted

# Run first in each child: arm SIGTERM for when the launcher dies, however it dies (Linux's
# PR_SET_PDEATHSIG, kept across exec), give up if it already died, then exec the child's own command.
# Not a preexec_fn: Python code between fork and exec runs grpc's fork handlers in a launcher that holds
# gRPC threads, and one such child aborted (SIGABRT) before it started.
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit('h2: the launcher exited before this child started')\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")


class Supervisor:

    def __init__(self, say: Callable[[str], None], env: dict | None = None):
        self.children: dict[str, Child] = {}
        self.say = say
        self.env = {**os.environ, **(env or {})}

    def start(self, child: Child, argv: list[str] | None = None) -> None:
        self.children[child.name] = child
        argv = argv or child.argv
        out = open(child.log_path, "a", encoding="utf-8") if child.log_path else None
        try:
            child.process = subprocess.Popen([sys.executable, "-c", DIE_WITH_PARENT,
                                              str(os.getpid()), *argv], stdout=out or None, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.env)
        finally:
            if out:
                out.close()
        child.starts += 1
        child.restart_at, child.reaped = None, False

    def kill(self, name: str) -> None:
        child = self.children[name]
        if child.process is not None and child.process.poll() is None:
            child.process.send_signal(signal.SIGKILL)
            child.process.wait()
            self.say(f"fault injection: killed {name} (pid {child.process.pid})")

    def poll(self) -> None:
        """Notice exits; restart, after their delay, children that stopped unexpectedly and have a restart line."""
        now = time.monotonic()
        for child in self.children.values():
            if child.process is None:
                continue
            code = child.process.poll()
            if code is not None and not child.reaped:
                child.reaped = True
                child.exit_codes.append(code)
                if code in (0, BAD_INPUT) or child.restart_argv is None:
                    if code:
                        self.say(f"{child.name} exited with {code} (see its log): not restarted")
                elif child.starts > MAX_RESTARTS:
                    self.say(f"{child.name} exited with {code} after {child.starts} starts: giving up on it")
                else:
                    child.restart_at = now + child.restart_delay_s
                    self.say(f"{child.name} exited with {code}: restarting it in {child.restart_delay_s:g} s")
            if child.restart_at is not None and now >= child.restart_at:
                self.start(child, child.restart_argv())
                self.say(f"restarted {child.name} (start {child.starts})")

    def running(self, names: list[str]) -> list[str]:
        """Those of `names` that run or will be restarted."""
        return [name for name in names if not self.children[name].reaped or self.children[name].restart_at is not None]

    def stop_all(self, timeout_s: float = 10.0) -> None:
        for child in self.children.values():
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children.values():
            if child.process is not None:
                try:
                    child.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.process.kill()
                    child.process.wait()
