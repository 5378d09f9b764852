"""``python -m harness.faults`` (``make faults``)."""

import sys

from harness.faults.cli import main

sys.exit(main())
