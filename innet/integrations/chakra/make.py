"""Chakra traces made here: ASTRA-sim's microbenchmarks (``microbenchmark``: byte for byte its generator_scripts'
files) and the examples innet ships in examples/chakra (``data_parallel``: a training step whose two gradient buckets
are all-reduced as the backward pass goes on; ``pipeline``: two stages passing activations and gradients)."""

from __future__ import annotations

import os

from innet.integrations.chakra.trace import COMP, RECV, SEND, Node, collective_node, write


def microbenchmark(folder: str, comm_type: str, npus: int, megabytes: int = 1) -> list[str]:
    """ASTRA-sim's microbenchmark trace of one ``comm_type`` collective (``ALL_REDUCE``, ``ALL_GATHER``,
    ``ALL_TO_ALL``, ``REDUCE_SCATTER``) of ``megabytes`` MiB on ``npus`` ranks, written into ``folder`` as its
    generator_scripts write it (NAME.RANK.et, rank r's one node numbered r): the files."""
    name = comm_type.lower()
    files = []
    for rank in range(npus):
        path = os.path.join(folder, f"{name}.{rank}.et")
        write(path, [collective_node(rank, f"{name}_{npus}npus_{megabytes}MB", comm_type, megabytes << 20)])
        files.append(path)
    return files


def _comp(id: int, name: str, micros: int, *deps: int) -> Node:
    return Node(id, name, COMP, data_deps=deps, duration_micros=micros, attrs={"is_cpu_op": False})


def _message(id: int, name: str, kind: int, src: int, dst: int, size: int, tag: int, *deps: int) -> Node:
    return Node(id, name, kind, data_deps=deps, attrs={"is_cpu_op": False, "comm_src": src, "comm_dst": dst,
                                                       "comm_size": size, "comm_tag": tag})


def data_parallel(folder: str, ranks: int = 8) -> list[str]:
    """A data-parallel training step on ``ranks`` ranks: forward (1.5 ms), the last layer's backward (1 ms), then its
    gradients' all-reduce (256 KiB) while the first layer's backward runs (1 ms), that layer's all-reduce (1 MiB),
    and the optimizer's step (0.2 ms) once both are in. NAME.RANK.et files in ``folder``: their paths."""
    nodes = [_comp(1, "forward", 1500), _comp(2, "backward layer 2", 1000, 1),
             collective_node(3, "all_reduce bucket 2", "ALL_REDUCE", 256 << 10, (2,)),
             _comp(4, "backward layer 1", 1000, 2),
             collective_node(5, "all_reduce bucket 1", "ALL_REDUCE", 1 << 20, (4,)),
             _comp(6, "optimizer step", 200, 3, 5)]
    return _write_ranks(folder, "data_parallel", [nodes] * ranks)


def pipeline(folder: str) -> list[str]:
    """Two pipeline stages: stage 0's forward (0.5 ms) sends its activations (256 KiB) to stage 1, which runs its
    forward and backward (1 ms) and sends the gradients back for stage 0's backward (0.5 ms)."""
    stage0 = [_comp(1, "stage 0 forward", 500), _message(2, "send activations", SEND, 0, 1, 256 << 10, 0, 1),
              _message(3, "recv gradients", RECV, 1, 0, 256 << 10, 1, 2), _comp(4, "stage 0 backward", 500, 3)]
    stage1 = [_message(1, "recv activations", RECV, 0, 1, 256 << 10, 0),
              _comp(2, "stage 1 forward and backward", 1000, 1),
              _message(3, "send gradients", SEND, 1, 0, 256 << 10, 1, 2)]
    return _write_ranks(folder, "pipeline", [stage0, stage1])


def _write_ranks(folder: str, name: str, ranks: list[list[Node]]) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    files = []
    for rank, nodes in enumerate(ranks):
        files.append(os.path.join(folder, f"{name}.{rank}.et"))
        write(files[-1], nodes)
    return files
