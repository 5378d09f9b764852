"""``python -m harness.registry``: the local schema registry's command line."""

import sys

from harness.registry.cli import main

sys.exit(main())
