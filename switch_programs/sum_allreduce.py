"""SwitchML-style in-network sum all-reduce, hierarchical when the plan says so.

Workers agree on one fixed-point exponent, then stream their tensor through the switches' slot
pool; each aggregating switch adds its children's chunks exactly once (int32, every addition
checked for overflow) and sends the sum up, or multicasts it down at the root. Everything but the
operator is ``Reduction``'s (innet.switch.reduction).
"""

from innet import SUM, Reduction


class SumAllreduce(Reduction):
    name = "sum_allreduce"
    operator = SUM
