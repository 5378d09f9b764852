"""``python -m producer_tools.bench``: the benchmark (and its worker processes)."""

import sys

from producer_tools.bench.cli import main

sys.exit(main())
