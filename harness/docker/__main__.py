"""``python -m harness.docker``: see :mod:`harness.docker.cli`."""

import sys

from harness.docker.cli import main

sys.exit(main())
