"""The embedded corpus: the interpreter's standard-library `.py` sources, in sorted path order."""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass

import numpy as np

from h2.core.errors import UserError

DEFAULT_MAX_BYTES = 8 * 2**20
DOCUMENT_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Corpus:
    """Token ids (uint8 bytes) and a fingerprint that identifies exactly this text."""

    tokens: np.ndarray
    fingerprint: str
    source: str

    def __len__(self) -> int:
        return len(self.tokens)

    def split(self, validation_fraction: float) -> tuple["Corpus", "Corpus"]:
        """The first part for training, the last `validation_fraction` for validation."""
        cut = int(len(self.tokens) * (1.0 - validation_fraction))
        return (Corpus(self.tokens[:cut], self.fingerprint + ":train", self.source),
                Corpus(self.tokens[cut:], self.fingerprint + ":val", self.source))


def _python_sources(root: str) -> list[str]:
    paths = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("__pycache__", "site-packages"))
        paths.extend(os.path.join(directory, name) for name in sorted(files) if name.endswith(".py"))
    return sorted(paths, key=lambda p: os.path.relpath(p, root))


def load_stdlib_corpus(max_bytes: int = DEFAULT_MAX_BYTES, root: str | None = None) -> Corpus:
    """Concatenate standard-library sources (documents separated by a blank line) up to max_bytes."""
    root = root or sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    separator = DOCUMENT_SEPARATOR.encode()
    for path in _python_sources(root):
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        chunks.append(data + separator)
        total += len(data) + len(separator)
        if total >= max_bytes:
            break
    text = b"".join(chunks)[:max_bytes]
    if len(text) < 1024:
        raise UserError(f"corpus: found only {len(text)} bytes of Python sources under {root}")
    tokens = np.frombuffer(text, dtype=np.uint8)
    return Corpus(tokens, hashlib.sha256(text).hexdigest()[:16], root)
