"""Checkpoints written atomically: a crash at any point leaves the previous checkpoint loadable.

Layout in `<out>/checkpoints/`: `step_<N>.pt` files and `latest`, a one-line pointer. A new file
is written under a temporary name, flushed to disk and renamed into place; only then is `latest`
replaced the same way, and only after that are old checkpoints pruned.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from h2.core.errors import UserError

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, write) -> None:
    """Call write(handle) on a temporary file beside `path`, fsync it, then rename over `path`."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class CheckpointDir:
    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "checkpoints")

    def steps(self) -> list[int]:
        if not os.path.isdir(self.path):
            return []
        return sorted(int(m.group(1)) for m in map(_STEP_FILE.match, os.listdir(self.path)) if m)

    def file_for(self, step: int) -> str:
        return os.path.join(self.path, f"step_{step:08d}.pt")

    def latest_step(self) -> int | None:
        pointer = os.path.join(self.path, "latest")
        try:
            with open(pointer, encoding="utf-8") as handle:
                name = handle.read().strip()
        except FileNotFoundError:
            return None
        match = _STEP_FILE.match(name)
        if not match:
            raise UserError(f"{pointer}: does not name a checkpoint file (got {name!r})")
        return int(match.group(1))

    def save(self, step: int, state: dict[str, Any], keep: int) -> str:
        os.makedirs(self.path, exist_ok=True)
        target = self.file_for(step)
        atomic_write(target, lambda handle: torch.save(state, handle))
        atomic_write(os.path.join(self.path, "latest"),
                     lambda handle: handle.write(os.path.basename(target).encode() + b"\n"))
        for old in self.steps()[:-keep]:
            if old != step:
                os.remove(self.file_for(old))
        return target

    def remove_all(self) -> None:
        for step in self.steps():
            os.remove(self.file_for(step))
        pointer = os.path.join(self.path, "latest")
        if os.path.exists(pointer):
            os.remove(pointer)

    def load_latest(self, map_location="cpu") -> dict[str, Any]:
        step = self.latest_step()
        if step is None:
            raise UserError(f"{self.path}: no checkpoint to resume from")
        path = self.file_for(step)
        try:
            return torch.load(path, map_location=map_location, weights_only=False)
        except FileNotFoundError:
            raise UserError(f"{path}: named by 'latest' but missing") from None
        except Exception as error:  # a damaged file must be reported, not crash with a traceback
            raise UserError(f"{path}: unreadable checkpoint ({type(error).__name__}: {error})") from None
