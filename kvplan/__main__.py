"""`python -m kvplan`: the same command line as the `kvplan` script."""

import sys

from kvplan.cli import main

sys.exit(main())
