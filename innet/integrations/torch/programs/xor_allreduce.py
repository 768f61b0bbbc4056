"""In-network bitwise-xor all-reduce: torch's ReduceOp.BXOR of integers, as int32 bit patterns (the group sends
int64 values this way only when they all fit int32)."""

from innet import Operator, Reduction


class XorAllreduce(Reduction):
    name = "xor_allreduce"
    operator = Operator("xor", "bitwise_xor", identity=0, rule="bits")
