"""Local multi-rank jobs: one function run as N processes on this machine, their return values back.

The one launcher of the tests and benchmarks that need several processes (DiComm scenarios,
torch.distributed jobs, HeteroPP pipelines, the two-process benchmarks):

    results = run_ranks(check, world_size=2, args=(store_dir,), timeout=60)

runs `check(rank, world_size, *args, **kwargs)` in `world_size` processes and returns what each
returned (pickled), in rank order. Every rank sees RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
(127.0.0.1) and MASTER_PORT (one free port for the job), plus `env` (a mapping, or a function of
the rank giving one). A rank that raises or exits without returning, or that has not finished when
the timeout runs out, ends the job at once: every rank still running is killed (the others would
wait forever for the dead one) and RankFailure names the ranks, what happened to them and the tail
of their stderr. `start_ranks` gives the same job as a handle (pid, kill, exit code, the results of
some ranks) for tests that kill or freeze a rank on purpose.

Targets: a module-level function, found in the rank by its module and name (the caller's sys.path
travels with it, so test helper modules on pytest's path work; a function of the main script is
found as multiprocessing finds it), or "path/to/file.py:function", loaded by path in the rank only
(for helper files that are not packages, or that must not be imported by the caller).

Start methods:
- "spawn" (default): each rank is a fresh interpreter started with its environment already set,
  so the target's module and everything it imports see the rank's variables (DiComm reads its
  DICOMM_* settings at import and creation);
- "forkserver": each rank forks from a clean server process that imported `preload` once (torch
  costs seconds per process on a small machine). Ranks never fork from the caller, whose threads
  (autograd's, after a backward on some device) make a plain fork unsafe. The environment is set
  before the target is loaded, but after `preload` was imported by the server; the preload list
  counts only where this process starts its first forkserver.

The job's folder (`h2-ranks-*`) and multiprocessing's (`pymp-*`, the forkserver's socket) name
their owner; a job's start removes those a process killed with SIGKILL left (h2.core.scratch).

Pure Python: imports nothing from the project outside h2.core, and never torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from h2.core import scratch

MASTER_ADDR = "127.0.0.1"
DEFAULT_TIMEOUT_S = 120.0
START_METHODS = ("spawn", "forkserver")
TAIL_LINES = 30
RANKS_FOLDER_PREFIX = "h2-ranks-"  # a job's spec, its ranks' logs and results
# Left in TMPDIR by a process killed with SIGKILL: a job's folder, and multiprocessing's folder of the
# forkserver's socket (pymp-*). A job's start removes those whose owner is gone (h2.core.scratch).
STALE_RANK_FOLDERS = (RANKS_FOLDER_PREFIX, "pymp-")

Env = Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None


class RankFailure(RuntimeError):
    """Some ranks of a job raised, exited without a result, or did not finish in time.

    `ranks` lists them; the message says what happened to each, with the tail of its stderr."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((MASTER_ADDR, 0))
        return sock.getsockname()[1]


def run_ranks(target: Callable | str, world_size: int, args: Sequence = (), kwargs: Mapping | None = None, *,
              env: Env = None, timeout: float | None = DEFAULT_TIMEOUT_S, start_method: str = "spawn",
              preload: Iterable[str] = (), master_port: int | None = None) -> list:
    """Run `target(rank, world_size, *args, **kwargs)` on every rank; their return values in rank order.

    Raises RankFailure, with every rank stopped, if a rank fails or the job outlasts `timeout`
    seconds (None: no limit)."""
    with start_ranks(target, world_size, args, kwargs, env=env, start_method=start_method, preload=preload,
                     master_port=master_port) as job:
        return job.results(timeout=timeout)


def start_ranks(target: Callable | str, world_size: int, args: Sequence = (), kwargs: Mapping | None = None, *,
                ranks: Iterable[int] | None = None, env: Env = None, start_method: str = "spawn",
                preload: Iterable[str] = (), master_port: int | None = None) -> RankJob:
    """Start the job's ranks (all of them, or only `ranks`) and return its handle; use it in a
    `with` block, which kills whatever still runs at its end."""
    return RankJob(target, world_size, args, kwargs, ranks=ranks, env=env, start_method=start_method, preload=preload,
                   master_port=master_port)


class RankJob:
    """Running ranks of one job: their pids, exit codes and results; kill one, or stop them all."""

    def __init__(self, target, world_size: int, args: Sequence = (), kwargs: Mapping | None = None, *,
                 ranks: Iterable[int] | None = None, env: Env = None, start_method: str = "spawn",
                 preload: Iterable[str] = (), master_port: int | None = None):
        if start_method not in START_METHODS:
            raise ValueError(f"start_method {start_method!r}: expected one of {', '.join(START_METHODS)}")
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.ranks = list(range(world_size)) if ranks is None else list(ranks)
        for rank in self.ranks:
            if not 0 <= rank < world_size:
                raise ValueError(f"rank {rank} is outside a world of {world_size}")
        self.master_port = free_port() if master_port is None else master_port
        self.start_method = start_method
        self.description = target if isinstance(target, str) else f"{target.__module__}.{target.__qualname__}"
        reference = _reference(target)
        scratch.remove_stale(STALE_RANK_FOLDERS)
        self.directory = scratch.owned_folder(RANKS_FOLDER_PREFIX)
        spec = {
            "target": reference, "arguments": pickle.dumps((tuple(args), dict(kwargs or {}))),
            "sys_path": list(sys.path), "directory": self.directory
        }
        self._spec_path = os.path.join(self.directory, "spec.pickle")
        with open(self._spec_path, "wb") as handle:
            pickle.dump(spec, handle)
        self._processes: dict[int, _Process] = {}
        self._stopped: set[int] = set()  # killed by this job, not failed by themselves
        try:
            for rank in self.ranks:
                self._processes[rank] = self._start(rank, self._environment(rank, env), tuple(preload))
        except BaseException:
            self.stop()
            raise

    # ---- starting ------------------------------------------------------------------------
    def _environment(self, rank: int, env: Env) -> dict[str, str]:
        environment = dict(os.environ)
        environment.update(RANK=str(rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(rank),
                           MASTER_ADDR=MASTER_ADDR, MASTER_PORT=str(self.master_port))
        extra = env(rank) if callable(env) else env
        environment.update({key: str(value) for key, value in (extra or {}).items()})
        return environment

    def _log(self, rank: int, stream: str) -> str:
        return os.path.join(self.directory, f"rank{rank}.{stream}")

    def _start(self, rank: int, environment: dict[str, str], preload: tuple[str, ...]) -> _Process:
        if self.start_method == "spawn":
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            boot = f"import sys; sys.path.insert(0, {root!r}); from h2.core.ranks import _spawned; _spawned()"
            with open(self._log(rank, "out"), "wb") as out, open(self._log(rank, "err"), "wb") as err:
                return _Process(
                    subprocess.Popen([sys.executable, "-c", boot, self._spec_path,
                                      str(rank)], env=environment, stdin=subprocess.DEVNULL, stdout=out, stderr=err))
        import multiprocessing
        import multiprocessing.util

        context = multiprocessing.get_context("forkserver")
        if preload:
            context.set_forkserver_preload(list(preload))
        process = context.Process(
            target=_forkserved, name=f"rank{rank}", args=(self._spec_path, rank, environment, self._log(rank, "out"),
                                                          self._log(rank, "err")))
        process.start()
        scratch.mark_owner(multiprocessing.util.get_temp_dir())  # the forkserver's socket folder, pymp-*
        return _Process(process)

    # ---- one rank ------------------------------------------------------------------------
    def pid(self, rank: int) -> int:
        return self._processes[rank].pid

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig` (default SIGKILL) to a rank that is still running."""
        self._processes[rank].signal(sig)

    def exitcode(self, rank: int) -> int | None:
        """The rank's exit code (negative: the signal that ended it), None while it runs."""
        return self._processes[rank].poll()

    def wait(self, rank: int, timeout: float | None = DEFAULT_TIMEOUT_S) -> int:
        """Wait for a rank to end, however it ends; its exit code."""
        code = self._processes[rank].wait(timeout)
        if code is None:
            raise RankFailure(self._message([rank], f"did not exit within {timeout:g} s"), [rank])
        return code

    # ---- the job -------------------------------------------------------------------------
    def results(self, ranks: Iterable[int] | None = None, timeout: float | None = DEFAULT_TIMEOUT_S) -> list:
        """The return values of `ranks` (default: every started rank), in that order.

        Only those ranks are watched: another rank may die or hang on purpose. If one of them fails,
        or they have not all returned within `timeout` seconds, every rank still running is killed
        and RankFailure says which and why."""
        watched = self.ranks if ranks is None else list(ranks)
        deadline = None if timeout is None else time.monotonic() + timeout
        outcomes: dict[int, tuple[bool, Any]] = {}
        pause = 0.001
        while True:
            failed = []
            for rank in watched:
                if rank not in outcomes:
                    code = self._processes[rank].poll()
                    if code is not None:
                        outcomes[rank] = self._outcome(rank, code)
                        if not outcomes[rank][0]:
                            failed.append(rank)
            if failed:
                self.stop(keep_logs=True)
                message = "\n".join(self._message([rank], outcomes[rank][1]) for rank in failed)
                stopped = sorted(self._stopped)
                if stopped:
                    message += f"\n(ranks {', '.join(map(str, stopped))} were still running and were killed)"
                self._remove()
                raise RankFailure(message, failed)
            if len(outcomes) == len(watched):
                return [outcomes[rank][1] for rank in watched]
            if deadline is not None and time.monotonic() > deadline:
                late = [rank for rank in watched if rank not in outcomes]
                self.stop(keep_logs=True)
                killed = "were killed" if len(late) > 1 else "was killed"
                message = self._message(late, f"did not finish within {timeout:g} s and {killed}")
                self._remove()
                raise RankFailure(message, late)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def stop(self, keep_logs: bool = False) -> None:
        """Kill every rank still running, reap them all, and (unless `keep_logs`) remove the job's files."""
        for rank, process in self._processes.items():
            if process.poll() is None:
                process.signal(signal.SIGKILL)
                self._stopped.add(rank)
        for process in self._processes.values():
            process.wait(None)
        if not keep_logs:
            self._remove()

    def _remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RankJob:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ---- reporting -----------------------------------------------------------------------
    def _outcome(self, rank: int, code: int) -> tuple[bool, Any]:
        """(True, return value) or (False, what went wrong)."""
        path = os.path.join(self.directory, f"rank{rank}.result")
        if os.path.exists(path):
            try:
                with open(path, "rb") as handle:
                    returned, value = pickle.load(handle)
            except Exception as error:  # noqa: BLE001  (say so, rather than leave the ranks running)
                return False, f"returned a value this process cannot unpickle ({type(error).__name__}: {error})"
            if returned and code == 0:
                return True, value
            if not returned:
                return False, f"raised {value}"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return False, f"was killed by {name}"
        return False, f"exited with code {code} without returning"

    def _message(self, ranks: list[int], what: str) -> str:
        names = ", ".join(map(str, ranks))
        lines = [f"rank{'s' if len(ranks) > 1 else ''} {names} of {self.world_size} ({self.description}) {what}"]
        for rank in ranks:
            for stream in ("err", "out"):  # stdout only where stderr is empty
                tail = _tail(self._log(rank, stream))
                if tail:
                    lines.append(f"--- rank {rank} std{stream}, last lines ---\n{tail}")
                    break
            else:
                lines.append(f"--- rank {rank} wrote nothing ---")
        return "\n".join(lines)


class _Process:
    """A rank's process, whether a subprocess.Popen (spawn) or a multiprocessing.Process (forkserver)."""

    def __init__(self, process):
        self.process = process
        self.pid = process.pid

    def poll(self) -> int | None:
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll()
        return self.process.exitcode

    def signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None) -> int | None:
        if isinstance(self.process, subprocess.Popen):
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        self.process.join(timeout)
        return self.process.exitcode


def _tail(path: str, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ---- targets ----------------------------------------------------------------------------------
def _reference(target) -> tuple[str, str, bool]:
    """(module name or absolute .py path, qualified name, whether it is the caller's main script)."""
    if isinstance(target, str):
        path, colon, name = target.rpartition(":")
        if not colon or not path.endswith(".py") or not name:
            raise ValueError(f"target {target!r}: expected 'path/to/file.py:function'")
        if not os.path.isfile(path):
            raise ValueError(f"target {target!r}: no such file {os.path.abspath(path)}")
        return os.path.abspath(path), name, False
    module_name = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    module = sys.modules.get(module_name or "")
    if not callable(target) or module is None or "<" in qualname or _lookup(module, qualname) is not target:
        raise ValueError(f"target {target!r} is not a module-level function; pass one, or 'path/to/file.py:function'")
    if module_name != "__main__":
        return module_name, qualname, False
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.name:  # python -m package.module
        return spec.name, qualname, True
    path = getattr(module, "__file__", None)
    if path is None:
        raise ValueError(f"target {target!r} belongs to an interactive session; define it in a file")
    return os.path.abspath(path), qualname, True


def _lookup(module, qualname: str):
    value = module
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return value


def _load(reference: tuple[str, str, bool]):
    where, qualname, is_main = reference
    if is_main and "__mp_main__" in sys.modules:  # multiprocessing already loaded the caller's main script
        module = sys.modules["__mp_main__"]
    elif where.endswith(".py"):
        name = "__mp_main__" if is_main else os.path.splitext(os.path.basename(where))[0]
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) != where:
            name = f"_rank_target_{name}"
        module = sys.modules.get(name)
        if module is None:
            directory = os.path.dirname(where)
            if directory not in sys.path:
                sys.path.insert(0, directory)  # the file's siblings import as they do for the caller
            spec = importlib.util.spec_from_file_location(name, where)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    if is_main:  # values pickled by the caller name its main script __main__
        sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    function = _lookup(module, qualname)
    if not callable(function):
        raise AttributeError(f"{where} has no function {qualname}")
    return function


# ---- inside a rank ----------------------------------------------------------------------------
def _spawned() -> None:
    """Entry of a spawned rank: python -c ... SPEC_PATH RANK (environment set by the caller)."""
    spec_path, rank = sys.argv[1], int(sys.argv[2])
    with open(spec_path, "rb") as handle:
        spec = pickle.load(handle)
    sys.path[:] = spec["sys_path"]
    _run(spec, rank)


def _forkserved(spec_path: str, rank: int, environment: dict, out_path: str, err_path: str) -> None:
    """Entry of a rank forked by the forkserver (multiprocessing has set sys.path already)."""
    os.environ.clear()
    os.environ.update(environment)
    for fd, path in ((1, out_path), (2, err_path)):
        try:
            log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except FileNotFoundError:  # the job was stopped (its folder removed) while this rank was being forked
            os._exit(1)
        os.dup2(log, fd)
        os.close(log)
    with open(spec_path, "rb") as handle:
        spec = pickle.load(handle)
    _run(spec, rank)


def _run(spec: dict, rank: int) -> None:
    """Call the target, write (returned, value) where the caller finds it, and exit at once: a rank
    whose peer died must not wait at exit for operations that can never complete."""
    world_size = int(os.environ["WORLD_SIZE"])
    try:
        function = _load(spec["target"])
        args, kwargs = pickle.loads(spec["arguments"])
        outcome = (True, function(rank, world_size, *args, **kwargs))
    except BaseException as error:  # noqa: BLE001  (reported to the caller, SystemExit included)
        traceback.print_exc()
        outcome = (False, f"{type(error).__name__}: {error}")
    try:
        data = pickle.dumps(outcome)
    except Exception as error:  # noqa: BLE001
        data = pickle.dumps((False, f"returned a value that cannot be pickled ({type(error).__name__}: {error})"))
    path = os.path.join(spec["directory"], f"rank{rank}.result")
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(0 if outcome[0] else 1)
