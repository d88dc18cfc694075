"""User-facing errors of the ditorch tools: one line, exit code 2, no traceback."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable


class UserError(ValueError):
    """Bad input from the user (a file, a flag, a field). The message is shown as is, on one line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit 2 (argparse's own convention)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_cli(prog: str) -> Callable:
    """Decorate a CLI entry point: a UserError prints `prog: error: msg` and returns 2, no traceback."""

    def decorate(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def wrapped(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except UserError as error:
                print(f"{prog}: error: {error}", file=sys.stderr)
                return 2
            except BrokenPipeError:
                sys.stderr.close()
                return 0
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
                return 130

        return wrapped

    return decorate
