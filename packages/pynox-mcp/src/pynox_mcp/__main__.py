"""``python -m pynox_mcp``: the ``pynox-mcp`` command."""

import sys

from ._cli import main

sys.exit(main())
