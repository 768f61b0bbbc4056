#!/usr/bin/env python3
"""Write Chakra execution traces: the examples innet ships (examples/chakra: a data-parallel step of 8 ranks, a
two-stage pipeline), or with --microbenchmarks ASTRA-sim's microbenchmark traces (all_reduce, all_gather,
all_to_all, reduce_scatter on 4, 8 and 16 NPUs, 1 MB: its examples/workload/microbenchmarks, byte for byte).

    python scripts/chakra_traces.py examples/chakra
    python scripts/chakra_traces.py --microbenchmarks traces/   # then: innet replay traces/all_reduce/8npus_1MB
"""

from __future__ import annotations

import argparse
import os

from innet.integrations.chakra.make import data_parallel, microbenchmark, pipeline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="where the traces go (a folder per trace)")
    p.add_argument("--microbenchmarks", action="store_true", help="ASTRA-sim's microbenchmarks instead of the examples")
    args = p.parse_args()
    if args.microbenchmarks:
        for kind in ("ALL_REDUCE", "ALL_GATHER", "ALL_TO_ALL", "REDUCE_SCATTER"):
            for npus in (4, 8, 16):
                folder = os.path.join(args.folder, kind.lower(), f"{npus}npus_1MB")
                os.makedirs(folder, exist_ok=True)
                microbenchmark(folder, kind, npus)
    else:
        data_parallel(os.path.join(args.folder, "data_parallel"))
        pipeline(os.path.join(args.folder, "pipeline"))


if __name__ == "__main__":
    main()
