"""One host's (or one emulated node's) torchrun, as h2.launch.launcher starts it: torchrun's own agent,
run from here so that ranks that fail end in a file the launcher reads (global rank -> exit status,
negative for a signal) instead of torchrun's traceback and failure table; the launcher turns it into
one line per rank that died.

    python -m h2.launch.agent FAILURES_FILE <torchrun arguments>

Exit status: 0 when every rank exited 0, 1 when a rank failed (FAILURES_FILE written), 128 + N when
the agent itself was stopped by signal N. Imports torch's launcher only; nothing imports this module.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def write_failures(path: str, exit_codes: dict[int, int]) -> None:
    """{rank: exit status} as JSON, written whole or not at all; a job folder removed meanwhile (its
    launcher is gone) is one line on stderr."""
    partial = f"{path}.tmp.{os.getpid()}"
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({str(rank): code for rank, code in sorted(exit_codes.items())}, handle)
        os.replace(partial, path)
    except OSError as error:
        print(
            f"h2.launch.agent: cannot record the failed ranks in {path} ({error.strerror or error}): "
            f"{exit_codes}", file=sys.stderr, flush=True)


def read_failures(path: str) -> dict[int, int]:
    """What write_failures wrote; {} when there is no such file (no rank failed under that agent)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return {int(rank): int(code) for rank, code in json.load(handle).items()}
    except FileNotFoundError:
        return {}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m h2.launch.agent FAILURES_FILE <torchrun arguments>", file=sys.stderr)
        return 2
    failures_path, torchrun_argv = argv[0], argv[1:]
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(torchrun_argv))
    except ChildFailedError as failed:
        write_failures(failures_path, {rank: failure.exitcode for rank, failure in failed.failures.items()})
        return 1
    except SignalException as stopped:
        return 128 + int(stopped.sigval)
    except KeyboardInterrupt:  # before torchrun's own handlers were installed
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(main())
