#!/usr/bin/env python3
"""Run gradient all-reduce over an emulated topology: see ``--help`` and README.md."""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from innet.commands import console  # light: every heavy import is inside the run, where an interrupt is handled

    sys.exit(console(lambda: __import__("innet.cli", fromlist=["main"]).main()))
