"""A dependency-free progress bar on stderr: redrawn in place on a terminal, a line every so often otherwise;
and how a step's validation result reads in it and in a pipeline's progress line."""

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
        self.fields: dict[str, str] = {}  # the latest value of every field, shown until a newer one comes

    def update(self, done: int, **fields) -> None:
        self.done = done
        self.fields.update(fields)
        now = time.perf_counter()
        final = done >= self.total
        if not final and now - self.last_draw < (0.1 if self.interactive else self.every_s):
            return
        self.last_draw = now
        fraction = done / self.total if self.total else 1.0
        filled = int(self.width * fraction)
        rate = (done - self.first) / max(now - self.started, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        extra = " ".join(f"{k} {v}" for k, v in self.fields.items())
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                f"{rate:.1f} it/s eta {eta:.0f}s {extra}")
        if self.interactive:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def validation_fields(record: dict) -> dict[str, str]:
    """The validation loss and perplexity of a step's record, as the progress line shows them (none
    where the step did not evaluate)."""
    if record.get("val_loss") is None:
        return {}
    return {"val_loss": f"{record['val_loss']:.4f}", "val_ppl": f"{record['val_ppl']:.2f}"}


def validation_text(record: dict) -> str:
    """`validation_fields` as text for a progress line: ' val_loss L val_ppl P', or ''."""
    return "".join(f" {name} {value}" for name, value in validation_fields(record).items())
