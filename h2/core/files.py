"""Files written so that a kill, a full disk or an I/O error never leaves a half-written one in place,
and the SHA-256 that lets a reader tell a damaged file from an intact one.

`atomic_write` writes under a temporary name, fsyncs and renames into place: the file before it stays
whole whatever happens; a failed write is a `RunFailed` naming the file and the errno. `write_digested`
writes a file and, beside it, its size and SHA-256 (`<file>.sha256`); `check_digested` verifies a file
against them. Used by the checkpoints (h2.train.checkpoint) and the Di-PS shards' snapshots (h2.ps.shard).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from typing import Callable

from h2.core.errors import RunFailed, UserError

DIGEST_SUFFIX = ".sha256"  # beside a file: its size and SHA-256, as its writer wrote it
_READ_CHUNK = 1 << 20


def os_error_text(error: OSError) -> str:
    """'No space left on device (ENOSPC)' and the like."""
    name = errno.errorcode.get(error.errno, str(error.errno)) if error.errno else type(error).__name__
    return f"{error.strerror or error} ({name})"


def fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:  # absent (renamed into place), or the disk refuses even that
        pass


def atomic_write(path: str, write: Callable) -> None:
    """Call write(handle) on a temporary file beside `path`, fsync it, then rename over `path`. An
    OSError (disk full, I/O error) is a RunFailed naming `path` and the errno; the temporary is removed."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(directory)
    except OSError as error:
        raise RunFailed(f"cannot write {path}: {os_error_text(error)}") from None
    finally:
        remove_quietly(tmp)


def file_digest(path: str) -> str:
    """The SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_READ_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def digest_record(data: bytes) -> bytes:
    """What `<file>.sha256` holds for a file of content `data`: its size and SHA-256, as JSON."""
    return json.dumps({"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}).encode() + b"\n"


def read_digest_record(path: str) -> dict:
    """The size and SHA-256 written beside `path` (OSError, ValueError when it is not there or not one)."""
    with open(path + DIGEST_SUFFIX, encoding="utf-8") as handle:
        record = json.load(handle)
    if not isinstance(record, dict) or not isinstance(record.get("bytes"), int) or not isinstance(
            record.get("sha256"), str):
        raise ValueError(f"{path + DIGEST_SUFFIX}: not a size and SHA-256")
    return record


def write_digested(path: str, data: bytes, write: Callable | None = None) -> None:
    """`data` into `path` and its size and SHA-256 beside it, each atomically (`write(handle, data)`
    writes the content; a plain write by default). The digest is written last: a file without one was
    cut short."""
    atomic_write(path, lambda handle: (write or _write_plain)(handle, data))
    record = digest_record(data)
    atomic_write(path + DIGEST_SUFFIX, lambda handle: handle.write(record))


def _write_plain(handle, data: bytes) -> None:
    handle.write(data)


def check_digested(path: str) -> None:
    """UserError naming `path` unless it has the size and SHA-256 written beside it."""
    try:
        record = read_digest_record(path)
    except FileNotFoundError:
        raise UserError(f"{path}: has no {DIGEST_SUFFIX} beside it (its write was cut short)") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path}{DIGEST_SUFFIX}: unreadable ({type(error).__name__}: {error})") from None
    try:
        size = os.path.getsize(path)
        if size != record["bytes"]:
            raise UserError(f"{path}: {size} bytes, its digest says {record['bytes']} (cut short or replaced)")
        if file_digest(path) != record["sha256"]:
            raise UserError(f"{path}: its SHA-256 differs from the one written beside it (damaged or replaced)")
    except OSError as error:
        raise UserError(f"{path}: unreadable ({os_error_text(error)})") from None
