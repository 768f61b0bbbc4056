"""Top-k sparse all-reduce: ``sum_allreduce`` for chunks that may travel as (index, value) pairs.

Workers run with ``--topk F`` send each chunk in the shorter of its two forms (innet.wire.sparse):
dense values, or a SPARSE payload of (index, value) pairs. The switch densifies what comes in, sums
exactly as ``sum_allreduce`` does, and sends every partial sum and result out sparse whenever that
is shorter (the union of the contributors' indices), so bytes shrink with the density on every link.
"""

from innet import SUM, Reduction


class TopkSparse(Reduction):
    name = "topk_sparse"
    operator = SUM
    sparse = True
