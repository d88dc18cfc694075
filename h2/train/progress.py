"""A dependency-free progress bar on stderr: redrawn in place on a terminal, a line every so often otherwise."""

from __future__ import annotations

import sys
import time


class ProgressBar:

    def __init__(self, total: int, start: int = 0, stream=None, width: int = 28, every_s: float = 5.0):
        self.total, self.done, self.width = total, start, width
        self.stream = stream or sys.stderr
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every_s = every_s
        self.started = time.perf_counter()
        self.first = start
        self.last_draw = 0.0

    def update(self, done: int, **fields) -> None:
        self.done = done
        now = time.perf_counter()
        final = done >= self.total
        if not final and now - self.last_draw < (0.1 if self.interactive else self.every_s):
            return
        self.last_draw = now
        fraction = done / self.total if self.total else 1.0
        filled = int(self.width * fraction)
        rate = (done - self.first) / max(now - self.started, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        extra = " ".join(f"{k} {v}" for k, v in fields.items())
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                f"{rate:.1f} it/s eta {eta:.0f}s {extra}")
        if self.interactive:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
