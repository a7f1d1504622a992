"""`python -m servelab.cli`: the `servelab` command."""

import sys

from servelab.cli import main

sys.exit(main())
