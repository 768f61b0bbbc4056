#!/usr/bin/env python3
"""Measure again the link rate this machine carries faithfully, which ``--dilation auto`` divides the
requested rates by, and the wall time a frame pays per process hop, and rewrite the cache
(innet.backends.mininet.calibration). Needs root (Mininet).

    sudo python scripts/calibrate_dilation.py                     # the Python switch's: calibration.json
    sudo python scripts/calibrate_dilation.py --data-plane ebpf   # the eBPF switch's: calibration-ebpf.json
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.mininet.calibration import cache_file, calibration  # noqa: E402

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default=None, help="real Mbit/s to try, in order, then REFINE midpoints below the "
                   "first miss (default: innet.backends.mininet.calibration.RATES)")
    p.add_argument("--data-plane", choices=("python", "ebpf"), default="python",
                   help="the switches the calibration's star runs (each data plane is calibrated apart)")
    args = p.parse_args()
    cal = calibration(again=True, rates=tuple(float(r) for r in args.rates.split(",")) if args.rates else None,
                      data_plane=args.data_plane)
    print(f"faithful rate ({args.data_plane} switch): {cal.faithful_mbps:g} Mbit/s, ratios {cal.ratios}, "
          f"{cal.hop_s * 1e3:.3g} ms a process hop; cached in {cache_file(args.data_plane)}")
