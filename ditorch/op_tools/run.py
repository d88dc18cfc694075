"""`python -m ditorch.op_tools.run script.py [args...]`: run an unmodified script with the op tools
that DITORCH_* environment variables ask for (see ditorch.op_tools.environment); `-m module` runs
a module instead of a script."""

from __future__ import annotations

import runpy
import sys

from ditorch.op_tools.environment import TOOL_VARIABLES, activate_from_environment, requested

USAGE = "usage: python -m ditorch.op_tools.run [-m module | script.py] [args...]"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE + "\nswitch tools on with: " + ", ".join(TOOL_VARIABLES), file=sys.stderr)
        return 2
    if not requested():
        print("ditorch.op_tools.run: warning: no DITORCH_* op tool variable is set; running without tools",
              file=sys.stderr)
    activate_from_environment()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
