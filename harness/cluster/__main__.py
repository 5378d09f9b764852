"""``python -m harness.cluster``: see :mod:`harness.cluster.cli`."""

import sys

from harness.cluster.cli import main

sys.exit(main())
