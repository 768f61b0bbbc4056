"""The forms torch's calls take, read once for the ``innet`` group (innet.integrations.torch.group): a reduce
operator by its name, the options objects a ``ProcessGroup`` method takes in each of its overloads, and a tensor's
values as the flat numpy array the call plane carries (and back).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

OPS = {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "min", "MAX": "max", "BAND": "band", "BOR": "bor",
       "BXOR": "bxor"}
BITS = {torch.bfloat16: torch.int16}  # dtypes numpy lacks: their values travel as these (moved, never reduced)


def torch_name(op: str) -> str:
    """torch's name of innet's operator ``op`` ("prod": "PRODUCT")."""
    return next(name for name, ours in OPS.items() if ours == op)


def op_name(op: Any) -> str:
    """torch's name of a reduce operator (``ReduceOp.PRODUCT``: "PRODUCT"), whichever object stands for it."""
    kind = getattr(op, "op", op)  # a ReduceOp holds its RedOpType in ``op``
    return str(getattr(kind, "name", kind))


def op_of(given: Any) -> str:
    """innet's name of the reduce operator of ``given``: options with a ``reduceOp``, a ReduceOp, or None (SUM)."""
    if given is None:
        return "sum"
    name = op_name(getattr(given, "reduceOp", given))
    if name not in OPS:
        raise ValueError(f"innet: ReduceOp.{name} is not a reduce operator innet serves ({', '.join(OPS)})")
    return OPS[name]


def options(cls: type, given: Any = None, **fields: Any) -> Any:
    """``cls`` (torch's options of a call, e.g. ``BroadcastOptions``) as a call's overload gave it: ``given`` if it is
    one, its ``reduceOp`` if it is a reduce operator, else the defaults; then each of ``fields`` given (not None)."""
    if isinstance(given, cls):
        opts = given
    else:
        opts = cls()
        if given is not None and fields.get("reduceOp") is None:
            fields["reduceOp"] = given
    for name, value in fields.items():
        if value is not None:
            setattr(opts, name, value)
    return opts


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a tensor's values travel as (a bfloat16's: int16 bit patterns)."""
    return np.dtype(torch.empty(0, dtype=BITS.get(dtype, dtype)).numpy().dtype)


def reducible(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype the network reduces a ``dtype`` tensor as, None for one it only moves (bfloat16, bool)."""
    return None if dtype in BITS or dtype == torch.bool else numpy_dtype(dtype)


def flat(tensor: torch.Tensor) -> np.ndarray:
    """A copy of ``tensor``'s values, flat, as numpy (taken when the call is made: the call plane sends it later)."""
    t = tensor.detach().reshape(-1)
    if t.dtype in BITS:
        t = t.view(BITS[t.dtype])
    return np.array(t.numpy(), copy=True)


def tensor_of(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """``values`` (``flat``'s) as a tensor of ``like``'s dtype and shape."""
    return torch.from_numpy(np.ascontiguousarray(values)).view(like.dtype).view(like.shape)
