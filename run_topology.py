#!/usr/bin/env python3
"""Run gradient all-reduce over an emulated topology: see ``--help`` and README.md."""

import os
import signal
import sys


def _interrupt(*_):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM tears down like Ctrl-C, from the very start
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from innet.cli import main

        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
