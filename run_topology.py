#!/usr/bin/env python3
"""Run gradient all-reduce over an emulated topology: see ``--help`` and README.md."""

import os
import signal
import sys

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM is Ctrl-C from the very start
    try:  # innet.commands loads only the standard library: an interrupt here is a bare KeyboardInterrupt
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from innet.commands import console
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(console(lambda: __import__("innet.cli", fromlist=["main"]).main()))
