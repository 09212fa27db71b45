"""`python -m bench.worker`: one rank of a launch (see bench/worker/__init__.py)."""

import sys

from bench.worker.main import main

sys.exit(main())
