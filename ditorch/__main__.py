"""`python -m ditorch script.py [args...]` (or `-m module [args...]`): run an unmodified CUDA-written
script on this node's accelerator, as if its first line were `import ditorch` (which this import
has already done), with any op tools that DITORCH_* variables ask for. The `ditorch` command
(info, conformance, precision-diff, replay) is `h2.cli.ditorch`."""

import sys

from ditorch.op_tools.run import run_program

sys.exit(run_program(sys.argv[1:], "python -m ditorch", warn_without_tools=False))
