"""``python -m harness.localkafka``: the local broker's command line."""

import sys

from harness.localkafka.cli import main

sys.exit(main())
