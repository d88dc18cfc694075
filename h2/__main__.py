"""`python -m h2` is the `h2` command."""

import sys

from h2.cli.main import main

sys.exit(main())
