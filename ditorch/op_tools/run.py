"""`python -m ditorch.op_tools.run script.py [args...]`: run an unmodified script with the op tools
that DITORCH_* environment variables ask for (see ditorch.op_tools.environment); `-m module` runs
a module instead of a script. `run_program` is also what `python -m ditorch` and `ditorch run` run.

The program runs as `python script.py` would run it: as __main__, with sys.argv[0] the script and the
script's folder first on sys.path (so it imports its sibling modules). ditorch is imported before it,
and every Python process it starts imports ditorch first as well (ditorch/child_startup goes first on
PYTHONPATH), so torchrun workers and spawned children need no edit either."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from ditorch.op_tools.environment import TOOL_VARIABLES, activate_from_environment, requested

CHILD_STARTUP = Path(__file__).resolve().parent.parent / "child_startup"


def start_children_with_ditorch(environ=os.environ) -> None:
    """Python processes started from now on import ditorch first (through CHILD_STARTUP/sitecustomize.py)."""
    entries = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if str(CHILD_STARTUP) not in entries:
        environ["PYTHONPATH"] = os.pathsep.join([str(CHILD_STARTUP), *entries])


def run_program(argv: list[str], prog: str, warn_without_tools: bool = True) -> int:
    """Run `script.py args...` or `-m module args...` as __main__, with the requested op tools on."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(f"usage: {prog} [-m module | script.py] [args...]\nswitch op tools on with: " + ", ".join(TOOL_VARIABLES),
              file=sys.stderr)
        return 2
    if argv[0] != "-m" and not os.path.isfile(argv[0]):
        print(f"{prog}: cannot open script {argv[0]}: no such file", file=sys.stderr)
        return 2
    if warn_without_tools and not requested():
        print(f"{prog}: warning: no DITORCH_* op tool variable is set; running without tools", file=sys.stderr)
    start_children_with_ditorch()
    activate_from_environment()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_program(list(sys.argv[1:] if argv is None else argv), "python -m ditorch.op_tools.run")


if __name__ == "__main__":
    sys.exit(main())
