"""Scratch folders in TMPDIR that name the process owning them, so that a folder left behind by a
killed process (SIGKILL runs no cleanup) is removed by the next process that starts one.

`owned_folder(prefix)` makes a fresh folder with `owner.json` (the owner's pid and start time: a pid
reused by another process since has another start time); `mark_owner` records the same in a folder
made by someone else (multiprocessing's `pymp-*`); `remove_stale(prefixes)` removes the folders of
TMPDIR with those prefixes whose owner is gone. A folder without an owner record is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable

OWNER_FILE = "owner.json"


def process_start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def owner_alive(pid: int, started: int | None) -> bool:
    if started is None:  # recorded without /proc: only whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return process_start_time(pid) == started


def mark_owner(folder: str) -> None:
    """Record this process as `folder`'s owner (unless one is recorded already)."""
    path = os.path.join(folder, OWNER_FILE)
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"pid": os.getpid(), "started": process_start_time(os.getpid())}, handle)


def owned_folder(prefix: str) -> str:
    """A fresh folder in TMPDIR named `prefix...`, owned by this process."""
    folder = tempfile.mkdtemp(prefix=prefix)
    mark_owner(folder)
    return folder


def remove_stale(prefixes: Iterable[str], root: str | None = None) -> list[str]:
    """Remove the folders in `root` (TMPDIR) named with one of `prefixes` whose owner is gone; returns them."""
    root = root or tempfile.gettempdir()
    prefixes = tuple(prefixes)
    removed = []
    try:
        names = [name for name in os.listdir(root) if name.startswith(prefixes)]
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(root, name)
        try:
            with open(os.path.join(folder, OWNER_FILE), encoding="utf-8") as handle:
                owner = json.load(handle)
            alive = owner_alive(int(owner["pid"]), owner["started"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
