#!/usr/bin/env python3
"""Send malformed innet frames out of an interface: ``python scripts/fuzz_frames.py --help``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts.fuzz import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
