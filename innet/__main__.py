"""``python3 -m innet``: the ``innet`` command (innet.commands)."""

import sys

from innet.commands import console

sys.exit(console())
