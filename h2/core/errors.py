"""Errors for users and the one way every command line reports them.

`UserError` is bad input (a file, a field, a flag, a peer): its message is one line naming what is
wrong. `run_cli(prog)` turns it into `prog: error: message` on stderr and exit status 2, with no
traceback; `ArgumentParser` makes argparse's own usage errors take the same path. `RunFailed` is a
run that cannot go on through no fault of its input (a full disk, an I/O error): one line, exit 1.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable


class UserError(ValueError):
    """Bad input from the user (a file, a flag, a field). The message is shown as is, on one line."""


class RunFailed(Exception):
    """A run that cannot go on (disk full, I/O error): its message is one line naming the file and why."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are UserErrors: one line and exit 2 under `run_cli`."""

    def error(self, message: str):
        raise UserError(message)


def one_line(error: BaseException) -> str:
    """The first line of an error's message (vendor and torch errors can span many)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def report_user_error(prog: str, error: BaseException) -> int:
    print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
    return 2


def run_cli(prog: str, *, also: tuple[type[BaseException], ...] = ()) -> Callable:
    """Decorate a command's entry point (`main(argv) -> int`, or a subcommand's `run(args) -> int`):
    a UserError (and any type in `also`) prints `prog: error: message` and returns 2; a RunFailed the
    same line and returns 1; a closed output pipe ends quietly; Ctrl-C returns 130."""

    def decorate(main: Callable[..., int]) -> Callable[..., int]:

        @functools.wraps(main)
        def wrapped(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except (UserError, *also) as error:
                return report_user_error(prog, error)
            except RunFailed as error:
                print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
                return 1
            except BrokenPipeError:  # output piped into `head` and friends
                sys.stderr.close()
                return 0
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
                return 130

        wrapped.prog = prog
        return wrapped

    return decorate
