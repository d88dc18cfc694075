"""Byte-level tokenizer: every UTF-8 byte is a token (vocabulary 256), so nothing is downloaded."""

from __future__ import annotations

import numpy as np


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, tokens) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")
