"""The pieces of torch.distributed's process-group contract a test suite leans on, each printed as the rank sees it
(``R<rank> <what> <value>``), for tests/test_torch_contract.py to run under ``innet launch`` and under torchrun on
gloo and compare line for line. Every value is exact on both (small integers, or what goes to gloo itself)."""

import os
import sys
import time

import torch
import torch.distributed as dist


def say(line):
    """One line in one write (under torchrun the ranks share a pipe: a line of at most 4 KiB stays whole)."""
    os.write(1, (line.replace("\n", " ") + "\n").encode())


def show(what, value):
    say(f"R{dist.get_rank()} {what} {value!r}")


def future_of(work):
    return work.get_future().wait()


def main():
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD

    # PRODUCT and BXOR: integers through the network, floats on gloo itself
    for dtype in (torch.int32, torch.int64, torch.int8, torch.float32):
        t = torch.tensor([2, -3, 1, 5], dtype=dtype) + rank
        dist.all_reduce(t, dist.ReduceOp.PRODUCT)
        show(f"product {dtype}", t)
    t = torch.tensor([2, 3], dtype=torch.int64) * (rank + 1)
    dist.reduce(t, 1, dist.ReduceOp.PRODUCT)
    if rank == 1:  # a non-root's tensor: gloo leaves partial results in it, innet leaves it alone
        show("reduce product", t)
    t = torch.tensor([5, 3, 2**20], dtype=torch.int64) + rank
    dist.all_reduce(t, dist.ReduceOp.BXOR)
    show("bxor", t)

    # sparse all_reduce
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, rank + 1]]), torch.tensor([1.0, 2.0 * (rank + 1)]), (5,))
    work = dist.all_reduce(sparse, async_op=True)
    work.wait()
    show("sparse", (sparse.coalesce().indices().tolist(), sparse.coalesce().values().tolist(), future_of(work)[0].shape))

    # futures hold what gloo's hold
    tensors = [torch.ones(2) * (rank + 1), torch.ones(3) * (rank + 2)]
    show("allreduce_coalesced wait", dist.all_reduce_coalesced(tensors, async_op=True).wait())
    show("pg.allreduce(t)", future_of(pg.allreduce(torch.ones(2) * (rank + 1))))
    show("pg.allreduce([t])", future_of(pg.allreduce([torch.ones(2) * (rank + 1)])))
    outs = [torch.zeros(2) for _ in range(world)]
    show("all_gather", future_of(dist.all_gather(outs, torch.ones(2) * rank, async_op=True)))
    out = torch.zeros(world)
    show("all_gather_into_tensor", future_of(dist.all_gather_into_tensor(out, torch.ones(1) * rank, async_op=True)))
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    show("gather", future_of(dist.gather(torch.ones(2) * rank, gathered, dst=0, async_op=True)))
    out = torch.zeros(2)
    show("scatter", future_of(dist.scatter(out, [torch.ones(2) * r for r in range(world)] if rank == 0 else None,
                                           src=0, async_op=True)))
    value = future_of(dist.reduce(torch.ones(1) * (rank + 1), 1, async_op=True))
    if rank == 1:
        show("reduce", value)
    show("broadcast", future_of(dist.broadcast(torch.ones(1) * rank, 2, async_op=True)))
    show("barrier", future_of(dist.barrier(async_op=True)))

    # the process group's own call forms
    xs = [torch.ones(2) * rank]
    pg.broadcast(xs).wait()
    show("pg.broadcast(xs)", xs)
    x = torch.ones(2) * rank
    pg.broadcast(x, root=1).wait()
    show("pg.broadcast(x, root=1)", x)
    x = torch.ones(2) * rank
    pg.broadcast(x, 2).wait()
    show("pg.broadcast(x, 2)", x)
    xs = [torch.ones(2) * rank, torch.ones(2) * (10 + rank)]
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 1, 1
    pg.broadcast(xs, opts).wait()
    show("rootTensor", xs)
    x = torch.ones(2) * (rank + 1)
    pg.reduce(x, 0, dist.ReduceOp.MAX).wait()
    if rank == 0:
        show("pg.reduce(x, 0, MAX)", x)

    # the coalesced tensor calls
    inputs = [torch.ones(1) * rank, torch.ones(2) * (5 + rank)]
    outputs = [torch.zeros(world), torch.zeros(2 * world)]
    work = pg.allgather_into_tensor_coalesced(outputs, inputs)
    work.wait()
    show("allgather_into_tensor_coalesced", (outputs, future_of(work)))
    outputs = [torch.zeros(2), torch.zeros(1)]
    inputs = [torch.arange(2.0 * world) * (rank + 1), torch.arange(1.0 * world) - rank]
    pg.reduce_scatter_tensor_coalesced(outputs, inputs, dist.ReduceScatterOptions()).wait()
    show("reduce_scatter_tensor_coalesced", outputs)
    with dist._coalescing_manager(async_ops=True) as cm:
        a, b = torch.ones(2) * rank, torch.ones(3) * (rank + 1)
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    show("coalescing manager", (a, b))

    # a barrier implies the calls before it are done (those through the network and the side plane's)
    small = [torch.full((1,), float(rank + i)) for i in range(50)]
    for t in small:
        dist.all_reduce(t, async_op=True)
    out = torch.zeros(world)
    dist.all_to_all_single(out, torch.arange(world, dtype=torch.float32) + 10 * rank, async_op=True)
    dist.barrier()
    show("barrier implies wait", (torch.cat(small), out))

    # test_c10d_gloo.py's forms: a list all-gather of two inputs a rank (every output list takes every rank's), in
    # inference mode; bad arguments refused at the call, in gloo's words
    with torch.inference_mode():
        mine = [torch.tensor([2 * rank]), torch.tensor([2 * rank + 1])]
        lists = [[torch.zeros(1, dtype=torch.int64) for _ in range(2 * world)] for _ in range(2)]
        value = future_of(pg.allgather(lists, mine))
    show("allgather of two inputs", (lists, value))
    refused = []
    for call, words in ((lambda o: pg.broadcast([torch.zeros(1)], o), "invalid root rank"),
                        (lambda o: pg.scatter([torch.zeros(1)], [[torch.zeros(1)] * (world - 1)], o), "Incorrect input "
                         f"list size {world - 1}. Input list size should be {world}"),
                        (lambda o: pg.gather([[torch.zeros(1)] * world], [torch.zeros(1)], o), "requires empty output on"
                         " non-root")):
        opts = dist.ScatterOptions() if "Input" in words else dist.GatherOptions() if "output" in words else \
            dist.BroadcastOptions()
        opts.rootRank = world if "root rank" in words else rank if "Input" in words else (rank + 1) % world
        try:
            call(opts)
        except RuntimeError as exc:
            refused.append(words in str(exc))
    show("refused", refused)

    # point to point: receive from any source; every rank sends to all, then receives
    if rank == 0:
        got = torch.zeros(1)
        sources = []
        for _ in range(world - 1):
            work = pg.recv_anysource([got], 7)
            work.wait()
            sources.append(work._source_rank())
        show("any source", sorted(sources))
    else:
        dist.send(torch.ones(1) * rank, 0, tag=7)
    started = time.monotonic()
    received = [torch.zeros(3) for _ in range(world)]
    works = [dist.isend(torch.full((3,), 10.0 * rank + peer), peer) for peer in range(world) if peer != rank]
    works += [dist.irecv(received[peer], peer) for peer in range(world) if peer != rank]
    for work in works:
        work.wait()
    show("all to all by isend/irecv", received)
    say(f"R{rank} seconds p2p {time.monotonic() - started:.3f}")
    say(f"R{rank} backend {pg.name()} {pg._get_backend_name()}")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
