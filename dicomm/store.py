"""FileStore: a key-value store in a directory, for same-host processes without torch.

Any object with ``set(key, value)`` and a blocking ``get(key)`` can drive rendezvous; every
torch.distributed Store qualifies. This one needs only a shared directory.
"""
from __future__ import annotations

import os
import tempfile
import time
import urllib.parse


class FileStore:

    def __init__(self, path: str | os.PathLike, timeout: float = 300.0):
        self.path = os.fspath(path)
        self.timeout = timeout
        os.makedirs(self.path, exist_ok=True)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, urllib.parse.quote(key, safe=""))

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self._file(key))

    def check(self, keys: list[str]) -> bool:
        """Whether every key is set (without waiting), as torch.distributed stores answer."""
        return all(os.path.exists(self._file(key)) for key in keys)

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout
        pause = 0.001
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"FileStore {self.path}: key '{key}' was not set within {self.timeout} s")
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
