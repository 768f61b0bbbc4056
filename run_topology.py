#!/usr/bin/env python3
"""Run gradient all-reduce over an emulated topology: see ``--help`` and README.md."""

import os
import signal
import sys


def _interrupt(*_):
    raise KeyboardInterrupt


def _interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an interrupt or was raised by one: Python 3.11 wraps an interrupt that lands in a
    class body's ``__set_name__`` (e.g. while networkx is being imported) in a RuntimeError."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM tears down like Ctrl-C, from the very start
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from innet.cli import main

        sys.exit(main())
    except BaseException as exc:  # noqa: BLE001 -- an interrupt, however wrapped, is exit 130; the rest goes on up
        if isinstance(exc, SystemExit) or not _interrupted(exc):
            raise
        print("interrupted", file=sys.stderr)
        sys.exit(130)
