"""The arguments of a ``ProcessGroup`` call on an ``innet`` group checked as gloo checks them, before anything is
sent: a bad one raises ``RuntimeError`` on the rank that made it, with gloo's words in the message (torch's own
tests match them: ``test_c10d_gloo.py``'s ``*_checks``), so no rank waits for a call its peers refused.
"""

from __future__ import annotations

from typing import Any

import torch


def bad(call: str, why: str) -> RuntimeError:
    return RuntimeError(f"innet {call}: {why}")


def root_rank(call: str, root: int, size: int) -> None:
    if not 0 <= root < size:
        raise bad(call, f"invalid root rank: {root}")


def root_tensor(call: str, index: int, tensors: list[torch.Tensor]) -> None:
    if not 0 <= index < len(tensors):
        raise bad(call, f"invalid root tensor: {index}")


def alike(call: str, first: torch.Tensor, others: list[torch.Tensor]) -> None:
    """``others`` of ``first``'s layout, dtype and size (gloo's "invalid tensor layout/type/size")."""
    for t in others:
        if t.layout != first.layout:
            raise bad(call, "invalid tensor layout")
        if t.dtype != first.dtype:
            raise bad(call, "invalid tensor type")
        if t.shape != first.shape:
            raise bad(call, "invalid tensor size")


def nonempty(call: str, tensors: list[torch.Tensor], what: str = "tensor list") -> None:
    if not tensors:
        raise bad(call, f"requires non-empty {what}")


def allreduce(tensors: list[torch.Tensor]) -> None:
    nonempty("allreduce", tensors)
    alike("allreduce", tensors[0], tensors[1:])


def allreduce_coalesced(tensors: list[torch.Tensor]) -> None:
    nonempty("allreduce_coalesced", tensors)
    for i, t in enumerate(tensors):
        if t.layout != tensors[0].layout:
            raise bad("allreduce_coalesced", f"invalid tensor layout at index {i}")
    if any(t.dtype != tensors[0].dtype for t in tensors):
        raise bad("allreduce_coalesced", "tensors must all have the same type")
    if tensors[0].is_sparse:
        raise bad("allreduce_coalesced", "unsupported layout")


def broadcast(tensors: list[torch.Tensor], opts: Any, size: int) -> None:
    root_rank("broadcast", opts.rootRank, size)
    root_tensor("broadcast", opts.rootTensor, tensors)
    alike("broadcast", tensors[0], tensors[1:])


def reduce(tensors: list[torch.Tensor], opts: Any, size: int) -> None:
    root_rank("reduce", opts.rootRank, size)
    root_tensor("reduce", opts.rootTensor, tensors)
    if len(tensors) != 1:
        raise bad("reduce", "requires a single-element tensor list")


def allgather(outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], size: int) -> None:
    nonempty("allgather", inputs, "input tensor list")
    if len(outputs) != len(inputs):
        raise bad("allgather", "requires input/output tensor lists to have the same length")
    for i, out in enumerate(outputs):
        if len(out) != len(inputs) * size:
            raise bad("allgather", f"invalid output tensor list at index {i} (expected length {len(inputs) * size}, "
                                   f"got {len(out)})")
    alike("allgather", inputs[0], [*inputs[1:], *(t for out in outputs for t in out)])


def gather(outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], root: int, rank: int, size: int) -> None:
    root_rank("gather", root, size)
    if len(inputs) != 1:
        raise bad("gather", "requires a single-element input tensor list")
    if rank == root:
        if len(outputs) != 1:
            raise bad("gather", "requires a single-element output list")
        if len(outputs[0]) != size:
            raise bad("gather", f"Incorrect output list size {len(outputs[0])}. Output list size should be {size}")
        alike("gather", inputs[0], outputs[0])
    elif outputs:
        raise bad("gather", "requires empty output on non-root")


def scatter(outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], root: int, rank: int, size: int) -> None:
    root_rank("scatter", root, size)
    if len(outputs) != 1:
        raise bad("scatter", "requires a single-element output tensor list")
    if rank == root:
        if len(inputs) != 1:
            raise bad("scatter", "requires a single-element input list")
        if len(inputs[0]) != size:
            raise bad("scatter", f"Incorrect input list size {len(inputs[0])}. Input list size should be {size}")
        alike("scatter", outputs[0], inputs[0])
    elif inputs:
        raise bad("scatter", "requires empty input on non-root")
