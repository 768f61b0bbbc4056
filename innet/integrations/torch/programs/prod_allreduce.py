"""In-network product all-reduce: torch's ReduceOp.PRODUCT of integers. The values travel as int32 as they are and
the switches multiply them modulo 2**32, so every rank gets the product modulo 2**32: torch's own for integers of 32
bits or fewer, and for int64 when the product fits int32 (the group checks that before)."""

from innet import Operator, Reduction


class ProdAllreduce(Reduction):
    name = "prod_allreduce"
    operator = Operator("prod", "multiply", identity=1, rule="bits", arithmetic="wrap")
