#!/usr/bin/env python3
"""Measure again the link rate this machine carries faithfully, which ``--dilation auto`` divides the
requested rates by, and the wall time a frame pays per process hop, and rewrite the cache
(innet.backends.mininet.calibration). Needs root (Mininet).

    sudo python scripts/calibrate_dilation.py
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.mininet.calibration import cache_dir, calibration  # noqa: E402

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default=None, help="real Mbit/s to try, in order (default: innet.backends.mininet.calibration.RATES)")
    args = p.parse_args()
    cal = calibration(again=True, rates=tuple(float(r) for r in args.rates.split(",")) if args.rates else None)
    print(f"faithful rate: {cal.faithful_mbps:g} Mbit/s, {cal.hop_s * 1e3:.3g} ms a process hop; "
          f"cached in {os.path.join(cache_dir(), 'calibration.json')}")
