#!/usr/bin/env python3
"""Measure again the link rate this machine carries faithfully, which ``--dilation auto`` divides the
requested rates by, and rewrite the cache (innet.backends.mininet.calibration). Needs root (Mininet).

    sudo python scripts/calibrate_dilation.py
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.mininet.calibration import cache_dir, faithful_rate  # noqa: E402

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default=None, help="real Mbit/s to try, in order (default: innet.backends.mininet.calibration.RATES)")
    args = p.parse_args()
    rate = faithful_rate(again=True, rates=tuple(float(r) for r in args.rates.split(",")) if args.rates else None)
    print(f"faithful rate: {rate:g} Mbit/s; cached in {os.path.join(cache_dir(), 'calibration.json')}")
