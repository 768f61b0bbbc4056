#!/usr/bin/env python3
"""Measure again the link rate this machine carries faithfully, which ``--dilation auto`` divides the
requested rates by, and rewrite the cache (innet.backends.calibration). Needs root (Mininet).

    sudo python scripts/calibrate_dilation.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.calibration import cache_dir, faithful_rate  # noqa: E402

if __name__ == "__main__":
    rate = faithful_rate(again=True)
    print(f"faithful rate: {rate:g} Mbit/s; cached in {os.path.join(cache_dir(), 'calibration.json')}")
