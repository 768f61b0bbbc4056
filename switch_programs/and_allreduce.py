"""In-network bitwise-and all-reduce: the intersection of the workers' bit sets.

Values travel as int32 bit patterns, no fixed point, as for or_allreduce: every worker learns which
bits all workers set (torch.distributed's ReduceOp.BAND). Checked against ``np.bitwise_and.reduce``.
"""

from innet import BAND, Reduction


class AndAllreduce(Reduction):
    name = "and_allreduce"
    operator = BAND
