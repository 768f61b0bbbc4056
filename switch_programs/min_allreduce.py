"""In-network min all-reduce: every worker gets the element-wise min of all workers' tensors.

Workers agree on one fixed-point exponent (no headroom: the min is one of the inputs, so it cannot
overflow) and switches keep each slot's running min. Checked against np.minimum.reduce.
"""

from innet import MIN, Reduction


class MinAllreduce(Reduction):
    name = "min_allreduce"
    operator = MIN
