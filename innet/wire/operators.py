"""Reduce operators as values, as MPI_Op and NCCL's ncclRedOp_t are: one aggregation engine, the
operator a value it is given, and the result check takes the same value.

An operator names a numpy ufunc (``np.add.reduce`` is then the reference any result is checked
against), its identity (``ufunc(identity, x) == x``), and its fixed-point rule, which says what the
workers agree on before they stream:

- ``"sum"``: a shared magnitude exponent ``q`` (the max over workers) and ``ceil(log2 N)`` bits of
  headroom, so the sum of N values fits int32; switches still check every addition for overflow.
- ``"select"``: a shared exponent and no headroom: the result is one of the inputs (max, min), so it
  cannot overflow.
- ``"bits"``: no fixed point: the values are int32 bit patterns (sets as bitmaps, flags), sent as
  they are and combined bit by bit (or, and, xor).

A user's operator is a line in a program file::

    XOR = Operator("xor", "bitwise_xor", identity=0, rule="bits")
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from innet.errors import UserError
from innet.wire import fixedpoint

RULES = ("sum", "select", "bits")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Operator:
    """A reduce operator: ``name``, numpy ufunc name, ``identity`` and fixed-point ``rule`` (see module doc)."""

    name: str
    ufunc: str
    identity: int | None = None
    rule: str = "sum"

    def __post_init__(self) -> None:
        fn = getattr(np, self.ufunc, None)
        if not isinstance(fn, np.ufunc) or fn.nin != 2 or fn.nout != 1:
            raise UserError(f"operator {self.name}: {self.ufunc!r} is not a binary numpy ufunc (e.g. 'add', 'maximum')")
        if self.rule not in RULES:
            raise UserError(f"operator {self.name}: unknown fixed-point rule {self.rule!r}; expected one of {', '.join(RULES)}")
        if self.identity is None or not INT32_MIN <= int(self.identity) <= INT32_MAX:
            raise UserError(f"operator {self.name} has no identity in int32: give identity=v with {self.ufunc}(v, x) == x "
                            "for every x (sum: 0, max: -2**31, min: 2**31-1, or: 0, and: -1)")
        probe = np.array([INT32_MIN + 1, -7, -1, 0, 1, 7, INT32_MAX], np.int32)
        if not np.array_equal(fn(np.int32(self.identity), probe).astype(np.int32), probe):
            raise UserError(f"operator {self.name}: {self.identity} is not the identity of {self.ufunc} "
                            f"({self.ufunc}({self.identity}, x) != x)")

    @property
    def fn(self) -> np.ufunc:
        return getattr(np, self.ufunc)

    @property
    def can_overflow(self) -> bool:
        return self.rule == "sum"

    # -- what the workers agree on ------------------------------------------
    def exponent(self, tensor: np.ndarray) -> int:
        """A worker's contribution to the agreed exponent (the switches take the max)."""
        return 0 if self.rule == "bits" else fixedpoint.magnitude_exponent(tensor)

    def scale(self, q: int, nworkers: int) -> int:
        """The power-of-two scale every worker quantizes with, from the agreed exponent ``q``."""
        if self.rule == "bits":
            return 0
        return fixedpoint.scale_for(q, nworkers if self.rule == "sum" else 1)

    def quantize(self, tensor: np.ndarray, scale: int) -> np.ndarray:
        """A worker's values on the wire (int32)."""
        if self.rule == "bits":
            return np.asarray(tensor).astype(np.int32)
        return fixedpoint.quantize(tensor, scale)

    def dequantize(self, values: np.ndarray, scale: int) -> np.ndarray:
        """The wire's int32 result as the caller's values: float32, or int32 for a bit operator."""
        if self.rule == "bits":
            return np.asarray(values).astype(np.int32)
        return fixedpoint.dequantize(values, scale)

    def tolerance(self, exact: np.ndarray, scale: int, nworkers: int) -> np.ndarray:
        """Per-element bound on |dequantized result - exact float reduction| (0 for a bit operator)."""
        if self.rule == "bits":
            return np.zeros(np.shape(exact))
        if self.rule == "sum":
            return fixedpoint.error_bound(exact, scale, nworkers)
        return math.ldexp(1.0, -scale - 1) + np.abs(exact) * 2.0**-24  # one rounding, one float32 rounding

    # -- the references ------------------------------------------------------
    def reduce(self, arrays: Iterable[np.ndarray]) -> np.ndarray:
        """The operator over ``arrays`` element-wise, in int64 (or float64 for float inputs): the reference.
        Folded in one at a time, in order (what ``fn.reduce`` over a stack does, without the stack: a
        thousand workers' gradients need not all be held at once)."""
        out: np.ndarray | None = None
        for a in arrays:
            wide = np.asarray(a, np.float64 if np.asarray(a).dtype.kind == "f" else np.int64)
            out = wide.copy() if out is None else self.fn(out, wide, out=out)
        return np.zeros(0) if out is None else out


SUM = Operator("sum", "add", identity=0, rule="sum")
MAX = Operator("max", "maximum", identity=INT32_MIN, rule="select")
MIN = Operator("min", "minimum", identity=INT32_MAX, rule="select")
BOR = Operator("or", "bitwise_or", identity=0, rule="bits")
BAND = Operator("and", "bitwise_and", identity=-1, rule="bits")
OPERATORS = {op.name: op for op in (SUM, MAX, MIN, BOR, BAND)}
