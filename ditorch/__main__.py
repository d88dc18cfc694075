"""`python -m ditorch script.py [args...]` (or `-m module [args...]`): run an unmodified CUDA-written
script on this node's accelerator, as if its first line were `import ditorch` (which this import
has already done), with any op tools that DITORCH_* variables ask for; the Python processes it starts
import ditorch too (ditorch.op_tools.run). `ditorch run` is the same from the `ditorch` command
(h2.cli.ditorch: info, conformance, precision-diff, replay, run)."""

import sys

from ditorch.op_tools.run import run_program

sys.exit(run_program(sys.argv[1:], "python -m ditorch", warn_without_tools=False))
