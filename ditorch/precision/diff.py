"""`python -m ditorch.precision.diff --reference REF --candidate RUN`: the precision-diff command
on its own (the same as `ditorch precision-diff`)."""

from __future__ import annotations

import sys

from ditorch.op_tools.errors import OneLineParser, run_cli
from ditorch.precision.cli import add_precision_diff_arguments

PROG = "ditorch precision-diff"


@run_cli(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description="Compare a candidate run's loss curve with a reference run's "
                                                  "(exit 0 pass, 1 fail, 2 bad input).")
    add_precision_diff_arguments(parser)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
