"""One run per output folder: an exclusive lock on `<out>/.h2.lock`, taken by every command that
trains into a folder (`h2 train`, single-device and pipeline, `h2 run`, `h2 ps launch`) before any
work, and held until the process ends (the kernel releases a flock when its holder dies, however it
dies). The file holds the holder's pid, which a refused second run names.
"""

from __future__ import annotations

import fcntl
import os
import shutil

from h2.core.errors import UserError

LOCK_FILE = ".h2.lock"
_held: dict[str, int] = {}  # real path of a folder this process holds -> the lock file's descriptor


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "a process that has not yet written its pid"


def hold_output_folder(out_dir: str, flag: str = "--out") -> None:
    """Make `out_dir` this process's until it ends (creating the folder); a UserError naming the
    holder's pid when another process holds it. Holding a folder twice is holding it once."""
    key = os.path.realpath(out_dir)
    if key in _held:
        return
    try:
        os.makedirs(out_dir, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{flag} {out_dir}: exists and is not a folder") from None
    except OSError as error:
        raise UserError(f"output folder '{out_dir}' is not writable ({error.strerror or error})") from None
    path = os.path.join(out_dir, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise UserError(f"output folder '{out_dir}' is not writable ({error.strerror or error}: {path})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise UserError(f"{flag} {out_dir}: another run uses this folder ({holder} holds {path}); "
                        f"wait for it to end or choose another {flag}") from None
    except OSError as error:
        os.close(fd)
        raise UserError(f"{flag} {out_dir}: cannot lock {path} ({error.strerror or error})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd


def release_output_folder(out_dir: str) -> None:
    """Give the folder up before the process ends (a command that trains several runs in turn)."""
    fd = _held.pop(os.path.realpath(out_dir), None)
    if fd is not None:
        os.close(fd)


def empty_held_folder(out_dir: str) -> None:
    """Remove everything in a folder this process holds but its lock (`--overwrite`)."""
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if name == LOCK_FILE:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
