"""In-network bitwise-or all-reduce: the union of the workers' bit sets.

Values travel as int32 bit patterns, no fixed point: e.g. each worker's top-k index set as a
bitmap, so every worker learns the union of the indices anyone selected (how top-k libraries agree
on a common sparse support). Checked against ``np.bitwise_or.reduce``.
"""

from innet import BOR, Reduction


class OrAllreduce(Reduction):
    name = "or_allreduce"
    operator = BOR
