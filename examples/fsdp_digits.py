#!/usr/bin/env python3
"""PyTorch FSDP (fully_shard: each layer's parameters sharded over the ranks) on scikit-learn's digits
(examples/digits.py): an unmodified torch.distributed script.

    torchrun --nproc-per-node 4 examples/fsdp_digits.py                                    # gloo
    innet launch --backend local --topo star --workers 4 -- python examples/fsdp_digits.py  # through innet
"""

import torch
from digits import train
from torch.distributed.fsdp import fully_shard


def shard(net: torch.nn.Module) -> torch.nn.Module:
    for layer in net.children():
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    return fully_shard(net)


if __name__ == "__main__":
    train("fsdp_digits", shard)
