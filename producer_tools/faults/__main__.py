"""``python -m producer_tools.faults`` (``make faults``)."""

import sys

from producer_tools.faults.cli import main

sys.exit(main())
