"""``python -m harness.bench``: the benchmark (and its worker processes)."""

import sys

from harness.bench.cli import main

sys.exit(main())
