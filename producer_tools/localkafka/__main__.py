"""``python -m producer_tools.localkafka``: the local broker's command line."""

import sys

from producer_tools.localkafka.cli import main

sys.exit(main())
