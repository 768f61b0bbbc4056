#!/usr/bin/env python3
"""PyTorch DDP on scikit-learn's digits (examples/digits.py): an unmodified torch.distributed script.

    torchrun --nproc-per-node 4 examples/ddp_digits.py                                    # gloo
    innet launch --backend local --topo star --workers 4 -- python examples/ddp_digits.py  # through innet
"""

from digits import train
from torch.nn.parallel import DistributedDataParallel

if __name__ == "__main__":
    train("ddp_digits", DistributedDataParallel)
