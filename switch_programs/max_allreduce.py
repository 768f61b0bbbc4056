"""In-network max all-reduce: every worker gets the element-wise max of all workers' tensors.

Workers agree on one fixed-point exponent (no headroom: the max is one of the inputs, so it cannot
overflow) and switches keep each slot's running max. Checked against np.maximum.reduce.
"""

from innet import MAX, Reduction


class MaxAllreduce(Reduction):
    name = "max_allreduce"
    operator = MAX
