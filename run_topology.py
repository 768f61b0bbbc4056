#!/usr/bin/env python3
"""Run gradient all-reduce over an emulated topology: see ``--help`` and README.md."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from innet.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
