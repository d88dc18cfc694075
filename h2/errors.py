"""User-facing errors: one line that names the file and field, turned into exit code 2 by the CLIs."""

from __future__ import annotations

import functools
import sys
from typing import Callable


class UserError(ValueError):
    """Bad input from the user (a file, a flag, a field). The message is shown as is, on one line."""


def run_cli(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap a CLI entry point so that a UserError prints `prog: error: msg` and exits 2, no traceback."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except UserError as error:
            prog = getattr(main, "prog", None) or sys.argv[0].rsplit("/", 1)[-1]
            print(f"{prog}: error: {error}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # output piped into `head` and friends
            sys.stderr.close()
            return 0
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapped
