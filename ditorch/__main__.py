"""`python -m ditorch` is the `ditorch` command."""

import sys

from ditorch.cli import main

sys.exit(main())
