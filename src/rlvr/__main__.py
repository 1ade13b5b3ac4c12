"""``python -m rlvr``: the ``rlvr`` command."""

import sys

from rlvr.cli import main

sys.exit(main())
