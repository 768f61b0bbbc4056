"""Reduce operators as values, as MPI_Op and NCCL's ncclRedOp_t are: one aggregation engine, the
operator a value it is given, and the result check takes the same value.

An operator names a numpy ufunc (folded over the workers' values, the reference any result is checked
against), its identity (``ufunc(identity, x) == x``), and its fixed-point rule, which says what the
workers agree on before they stream:

- ``"sum"``: a shared magnitude exponent ``q`` (the max over workers) and ``ceil(log2 N)`` bits of
  headroom, so the sum of N values fits int32; switches still check every addition for overflow.
- ``"select"``: a shared exponent and no headroom: the result is one of the inputs (max, min), so it
  cannot overflow.
- ``"bits"``: no fixed point: the values are int32 bit patterns (sets as bitmaps, flags, counts), sent
  as they are and combined as the operator's arithmetic says (bit by bit for or, and, xor).

Its ``arithmetic`` says what a combine does past int32, the wire's integer type:

- ``"exact"`` (the default): it never gets there, with a proof: the sum rule's headroom (every addition
  still checked), a select's result being an input, a bit operator's result being bits of its inputs.
- ``"wrap"``: two's complement, modulo 2**32 (a product, a hash, a counter mod 2**32): ``bits`` only.
- ``"saturate"``: the 32 bits read as an unsigned count, each combine clipped to 0..2**32-1: ``bits``
  only. (A signed clip would not be exact: ``2**31-1 + 1 - 1`` clips or not with the order the
  contributions arrive in, which the switches do not choose.)

The switches, the PBox and the ring combine with ``combine`` and the result check folds with it
too, so a wrapping product is checked exactly as it runs. What an operator declares is tried on
sample values when it is made: a rule or an arithmetic its ufunc breaks, or a ufunc whose result
depends on the order contributions arrive in, is refused in one line.

A user's operator is a line in a program file::

    XOR = Operator("xor", "bitwise_xor", identity=0, rule="bits")
    PROD = Operator("prod", "multiply", identity=1, rule="bits", arithmetic="wrap")
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from innet.errors import UserError
from innet.wire import fixedpoint

RULES = ("sum", "select", "bits")
ARITHMETICS = ("exact", "wrap", "saturate")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT32_MAX = 2**32 - 1
# what a declaration is tried on: small values first, so a counterexample reads simply
SAMPLES = np.array([1, 2, 3, 7, 0, -1, -2, -7, 46341, 65536, -65537, INT32_MAX - 1, INT32_MAX, INT32_MIN + 1, INT32_MIN],
                   np.int64)
SMALL = SAMPLES[:11]  # sums of these stay far inside int32


@dataclass(frozen=True)
class Operator:
    """A reduce operator: ``name``, numpy ufunc name, ``identity``, fixed-point ``rule`` and ``arithmetic``
    on the wire's int32 (see module doc)."""

    name: str
    ufunc: str
    identity: int | None = None
    rule: str = "sum"
    arithmetic: str = "exact"

    def __post_init__(self) -> None:
        fn = getattr(np, self.ufunc, None)
        if not isinstance(fn, np.ufunc) or fn.nin != 2 or fn.nout != 1:
            raise UserError(f"operator {self.name}: {self.ufunc!r} is not a binary numpy ufunc (e.g. 'add', 'maximum')")
        if self.rule not in RULES:
            raise UserError(f"operator {self.name}: unknown fixed-point rule {self.rule!r}; expected one of {', '.join(RULES)}")
        if self.arithmetic not in ARITHMETICS:
            raise UserError(f"operator {self.name}: unknown arithmetic {self.arithmetic!r}; expected one of "
                            f"{', '.join(ARITHMETICS)}")
        if self.identity is None or isinstance(self.identity, bool) or not isinstance(self.identity, (int, np.integer)) \
                or not INT32_MIN <= int(self.identity) <= INT32_MAX:
            raise UserError(f"operator {self.name} has no identity in int32: give identity=v with {self.ufunc}(v, x) == x "
                            "for every x (sum: 0, max: -2**31, min: 2**31-1, or: 0, and: -1, product: 1)")
        problem = _refusal(self)
        if problem:
            raise UserError(f"operator {self.name}: {problem}")

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

    def quantize(self, tensor: np.ndarray, scale: int, out: np.ndarray | None = None) -> np.ndarray:
        """A worker's values on the wire (int32), written into ``out`` if given."""
        if self.rule == "bits":
            if out is None:
                return np.asarray(tensor).astype(np.int32)
            np.copyto(out, tensor, casting="unsafe")
            return out
        return fixedpoint.quantize(tensor, scale, out)

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

    # -- the combine and the reference ----------------------------------------
    def combine(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``a`` combined with ``b`` (int32 values of the wire) as the operator's arithmetic says: what every
        switch, the PBox and the ring compute, and what the result check folds with. Exact and wrapping
        arithmetic is the ufunc on int32 (numpy's int32 wraps); saturating, on the unsigned values, clipped."""
        if self.arithmetic != "saturate":
            return self.fn(a, b) if out is None else self.fn(a, b, out=out)
        wide = self.fn(_unsigned(a), _unsigned(b))
        total = np.minimum(wide, UINT32_MAX).astype(np.uint32).view(np.int32)
        if out is None:
            return total
        out[...] = total
        return out

    def reduce(self, arrays: Iterable[np.ndarray]) -> np.ndarray:
        """The operator over ``arrays`` element-wise: the reference. Exact arithmetic folds in int64 (or
        float64 for float inputs), where a result past int32 shows as one; wrapping and saturating fold with
        ``combine`` on int32, as the network does. Folded in one at a time, in order (what ``fn.reduce`` over
        a stack does, without the stack: a thousand workers' gradients need not all be held at once)."""
        out: np.ndarray | None = None
        for a in arrays:
            if self.arithmetic != "exact":
                wire = np.asarray(a).astype(np.int32)
                out = wire.copy() if out is None else self.combine(out, wire)
                continue
            wide = np.asarray(a, np.float64 if np.asarray(a).dtype.kind == "f" else np.int64)
            out = wide.copy() if out is None else self.fn(out, wide, out=out)
        return np.zeros(0) if out is None else out


def _unsigned(a: np.ndarray) -> np.ndarray:
    """int32 values as their unsigned 32-bit reading, widened (a product of two fits uint64)."""
    return np.asarray(a, np.int32).view(np.uint32).astype(np.uint64)


def _refusal(op: Operator) -> str:
    """What ``op``'s declaration gets wrong on the sample values, in a line; "" when nothing."""
    if op.rule != "bits" and op.arithmetic != "exact":
        return (f"arithmetic {op.arithmetic!r} is for rule 'bits' (int32 patterns as they are); rule {op.rule!r} "
                "works on fixed point and its arithmetic is exact")
    name, a, b = op.ufunc, SAMPLES[:, None], SAMPLES[None, :]
    with np.errstate(all="ignore"):
        try:
            wire = op.combine(a.astype(np.int32), b.astype(np.int32))
            wide = op.fn(a, b)
        except (TypeError, ValueError, ArithmeticError) as exc:
            return f"{name} fails on int32 values ({exc})"
        gives = wire.dtype if wide.dtype.kind in "iu" else wide.dtype
        if gives != np.int32:
            return f"{name} does not give integers on int32 values (it gives {gives})"
        if not np.array_equal(op.combine(np.full(len(SAMPLES), op.identity, np.int32), SAMPLES.astype(np.int32)),
                              SAMPLES.astype(np.int32)):
            return f"{op.identity} is not the identity of {name} ({name}({op.identity}, x) != x)"
        if op.rule == "sum":
            bad = wide[: len(SMALL), : len(SMALL)] != SMALL[:, None] + SMALL[None, :]
            if bad.any():
                i, j = _first(bad)
                return (f"rule 'sum' is addition with headroom, but {name}({SMALL[i]}, {SMALL[j]}) = {wide[i, j]}, "
                        f"not {SMALL[i] + SMALL[j]}; rule 'bits' combines int32 patterns as they are")
        if op.rule == "select":
            bad = (wide != a) & (wide != b)
            if bad.any():
                i, j = _first(bad)
                return (f"rule 'select' needs a result that is one of its inputs, but {name}({SAMPLES[i]}, {SAMPLES[j]}) "
                        f"= {wide[i, j]}")
        if op.rule == "bits" and op.arithmetic == "exact":
            bad = (wide < INT32_MIN) | (wide > INT32_MAX)
            if bad.any():
                i, j = _first(bad)
                return (f"{name}({SAMPLES[i]}, {SAMPLES[j]}) = {wide[i, j]} leaves int32, the wire's type: declare "
                        "arithmetic='wrap' (modulo 2**32) or 'saturate' (unsigned, clipped)")
        return _order_refusal(op)


def _order_refusal(op: Operator) -> str:
    """Why ``op``'s result would depend on the order contributions arrive in (switches fold as they come,
    a tree's partials in any grouping): a sample pair it does not commute on, or a triple it does not
    associate on; "" when none."""
    values = SAMPLES if op.rule != "sum" else SMALL
    if op.arithmetic == "exact":  # what the reference computes: the ufunc on wide integers
        def c(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return op.fn(x, y)
    else:
        values = values.astype(np.int32)

        def c(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return op.combine(np.asarray(x, np.int32), np.asarray(y, np.int32))
    a, b, z = values[:, None, None], values[None, :, None], values[None, None, :]
    ab, ba = c(a[:, :, 0], b[:, :, 0]), c(b[:, :, 0], a[:, :, 0])
    if (ab != ba).any():
        i, j = _first(ab != ba)
        return (f"{op.ufunc} does not commute: {op.ufunc}({values[i]}, {values[j]}) = {ab[i, j]} but "
                f"{op.ufunc}({values[j]}, {values[i]}) = {ba[i, j]}; switches combine contributions as they arrive")
    left, right = c(c(a, b), z), c(a, c(b, z))
    if (left != right).any():
        i, j, k = (int(x[0]) for x in np.nonzero(left != right))
        x, y, w = values[i], values[j], values[k]
        f = op.ufunc
        return (f"{f} does not associate ({op.arithmetic}): {f}({f}({x}, {y}), {w}) = {left[i, j, k]} but "
                f"{f}({x}, {f}({y}, {w})) = {right[i, j, k]}; switches combine contributions as they arrive")
    return ""


def _first(mask: np.ndarray) -> tuple[int, int]:
    i, j = np.nonzero(mask)
    return int(i[0]), int(j[0])


SUM = Operator("sum", "add", identity=0, rule="sum")
MAX = Operator("max", "maximum", identity=INT32_MIN, rule="select")
MIN = Operator("min", "minimum", identity=INT32_MAX, rule="select")
BOR = Operator("or", "bitwise_or", identity=0, rule="bits")
BAND = Operator("and", "bitwise_and", identity=-1, rule="bits")
OPERATORS = {op.name: op for op in (SUM, MAX, MIN, BOR, BAND)}
