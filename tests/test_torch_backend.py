"""torch.distributed's backend "innet" (innet.torch) against gloo: every collective it serves, every operator and
dtype, async Work, several process groups, uneven sizes. Integers bit for bit; floats within the fixed-point bound."""

import os
import time
import warnings
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import innet.torch
from innet.integrations.launch.procs import free_port
from innet.integrations.torch.fabric import exact_ints
from innet.integrations.torch.group import InnetGroup, check_torch
from innet.integrations.torch.methods import InnetWork, settle
from innet.wire import fixedpoint

WORLD = 3
LENGTH = 3001  # per rank: over a packet, not a multiple of one
OPS = {"SUM": np.add, "MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and, "BOR": np.bitwise_or}
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


def value(rank: int, dtype: torch.dtype, length: int = LENGTH, big: bool = False) -> torch.Tensor:
    """Rank ``rank``'s seeded input (the same on every rank that asks)."""
    rng = np.random.default_rng([rank, length, DTYPES.index(dtype)])
    if dtype.is_floating_point:
        return torch.from_numpy(rng.standard_normal(length) * 10.0 ** rng.integers(-3, 3)).to(dtype)
    high = 2**40 if big else 1000
    return torch.from_numpy(rng.integers(-high, high, length)).to(dtype)


def float_bound(inputs: list[np.ndarray], exact: np.ndarray, op: str) -> np.ndarray:
    """What fixed point may be off by (its scale agreed over ``inputs``, whole tensors): the sum's bound, or one
    rounding for min and max; plus float32 rounding of the result and of each input (a float64 travels as float32)."""
    q = max(fixedpoint.magnitude_exponent(x.astype(np.float32)) for x in inputs)
    n = len(inputs) if op == "SUM" else 1
    inputs_rounding = np.sum(np.abs(np.stack(inputs)), axis=0) * 2.0**-24
    return fixedpoint.error_bound(exact, fixedpoint.scale_for(q, n), n) + np.abs(exact) * 2.0**-22 + inputs_rounding


def same(got: torch.Tensor, want: torch.Tensor, inputs: list[np.ndarray], op: str, what: str, part=slice(None)) -> None:
    """``got`` (innet's) is ``want`` (gloo's) for integers, within the bound of the exact reduction for floats;
    ``part``: the slice of the reduction of whole ``inputs`` that ``got`` is."""
    if got.dtype.is_floating_point:
        exact = OPS[op].reduce(np.stack(inputs).astype(np.float64), axis=0)
        err = np.abs(got.numpy().astype(np.float64) - exact[part])
        assert np.all(err <= float_bound(inputs, exact, op)[part]), f"{what}: off by {err.max()}"
    else:
        assert torch.equal(got, want), what


def reductions(innet_g, gloo_g) -> None:
    rank = dist.get_rank()
    for dtype in DTYPES:
        inputs = [value(r, dtype).numpy() for r in range(WORLD)]
        for op in OPS if not dtype.is_floating_point else ("SUM", "MIN", "MAX"):
            reduce_op = getattr(dist.ReduceOp, op)
            mine, theirs = value(rank, dtype), value(rank, dtype)
            dist.all_reduce(mine, reduce_op, group=innet_g)
            dist.all_reduce(theirs, reduce_op, group=gloo_g)
            same(mine, theirs, inputs, op, f"all_reduce {op} {dtype}")
            mine, theirs = value(rank, dtype), value(rank, dtype)
            dist.reduce(mine, 2, reduce_op, group=innet_g)
            dist.reduce(theirs, 2, reduce_op, group=gloo_g)
            if rank == 2:
                same(mine, theirs, inputs, op, f"reduce {op} {dtype}")
            else:
                assert torch.equal(mine, value(rank, dtype)), "reduce leaves a non-root's tensor alone"
            whole = [value(r, dtype, LENGTH * WORLD).numpy() for r in range(WORLD)]
            mine, theirs = torch.empty(LENGTH, dtype=dtype), torch.empty(LENGTH, dtype=dtype)
            dist.reduce_scatter_tensor(mine, value(rank, dtype, LENGTH * WORLD), reduce_op, group=innet_g)
            dist.reduce_scatter_tensor(theirs, value(rank, dtype, LENGTH * WORLD), reduce_op, group=gloo_g)
            same(mine, theirs, whole, op, f"reduce_scatter {op} {dtype}", slice(rank * LENGTH, (rank + 1) * LENGTH))
    avg = value(rank, torch.float32)
    dist.all_reduce(avg, dist.ReduceOp.AVG, group=innet_g)
    inputs = [value(r, torch.float32).numpy() for r in range(WORLD)]
    exact = np.sum(inputs, axis=0, dtype=np.float64)
    assert np.all(np.abs(avg.numpy() - exact / WORLD) <= float_bound(inputs, exact, "SUM") / WORLD)


def movements(innet_g, gloo_g) -> None:
    """all-gather, broadcast and all-gather of lists move values: bit for bit, floats too."""
    rank = dist.get_rank()
    for dtype in DTYPES:
        mine, theirs = (torch.empty(LENGTH * WORLD, dtype=dtype) for _ in range(2))
        dist.all_gather_into_tensor(mine, value(rank, dtype), group=innet_g)
        dist.all_gather_into_tensor(theirs, value(rank, dtype), group=gloo_g)
        assert torch.equal(mine, theirs), f"all_gather_into_tensor {dtype}"
        mine = value(rank, dtype, 777)
        dist.broadcast(mine, 1, group=innet_g)
        assert torch.equal(mine, value(1, dtype, 777)), f"broadcast {dtype}"
        listed = [torch.empty(5, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(listed, value(rank, dtype, 5), group=innet_g)
        assert all(torch.equal(t, value(r, dtype, 5)) for r, t in enumerate(listed)), f"all_gather {dtype}"
    dist.barrier(group=innet_g)


def async_and_groups(innet_g, gloo_g) -> None:
    """Works in flight at once, then waited; a second innet group of two ranks as a ring; an integer sum the wire
    cannot carry exactly is reduced at rank 0, which warns; an all-to-all travels the links (no warning)."""
    rank = dist.get_rank()
    tensors = [value(rank, torch.int32, n) for n in (1, 2048, 5000)]
    works = [dist.all_reduce(t, group=innet_g, async_op=True) for t in tensors]
    for work, t, n in zip(works, tensors, (1, 2048, 5000), strict=True):
        assert work.wait() and work.is_completed()
        assert work.get_future().wait()[0] is t
        assert torch.equal(t, sum(value(r, torch.int32, n) for r in range(WORLD)))
    pair = dist.new_group([0, 1], backend="innet")
    if rank < 2:
        innet.torch.set_mode(pair, "ring")
        t = value(rank, torch.int64, 4099)
        dist.all_reduce(t, group=pair)
        assert torch.equal(t, value(0, torch.int64, 4099) + value(1, torch.int64, 4099))
    big = value(rank, torch.int64, 10, big=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.all_reduce(big, group=innet_g)
        out = torch.empty(WORLD, dtype=torch.int64)
        dist.all_to_all_single(out, torch.full((WORLD,), rank, dtype=torch.int64), group=innet_g)
    assert torch.equal(big, sum(value(r, torch.int64, 10, big=True) for r in range(WORLD)))
    assert out.tolist() == list(range(WORLD))
    if rank == 0:
        assert any("allreduce ReduceOp.SUM on int64" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert not any("all_to" in str(w.message) for w in caught)


def rank_main(rank: int, port: int) -> None:
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 renames all_gather_into_tensor; the old name is public
    dist.init_process_group("innet", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    gloo_g = dist.new_group(backend="gloo")
    innet_g = dist.group.WORLD
    reductions(innet_g, gloo_g)
    movements(innet_g, gloo_g)
    async_and_groups(innet_g, gloo_g)
    dist.barrier()
    dist.destroy_process_group()


def test_every_collective_op_and_dtype_matches_gloo():
    os.environ.pop("INNET_RUN", None)
    mp.start_processes(rank_main, args=(free_port(),), nprocs=WORLD, start_method="spawn")


def test_integers_go_in_network_only_where_the_wire_carries_them_exactly():
    small = [np.array([1000, -7]), np.array([3, 2**20])]
    assert exact_ints(small, "sum") and exact_ints(small, "max")
    assert not exact_ints([np.array([2**23]), np.array([2**23])], "sum")  # the sum needs 25 bits
    assert exact_ints([np.array([2**31 - 1, -(2**31)])], "bor") and not exact_ints([np.array([2**31])], "band")


def test_the_group_overrides_one_private_torch_name():
    """Of dist.ProcessGroup's private names the backend overrides only ``_set_group_name`` (keeps_its_name); the
    collectives are the public ones (reduce_scatter_single, all_gather_single, ...)."""
    ours = {n for klass in InnetGroup.__mro__[: InnetGroup.__mro__.index(dist.ProcessGroup)] for n in vars(klass)}
    private = {n for n in ours & set(dir(dist.ProcessGroup)) if n.startswith("_") and not n.startswith("__")}
    assert private == {"_set_group_name"}
    assert {"allreduce", "reduce_scatter_single", "all_gather_single", "broadcast", "barrier", "group_name"} <= ours


@pytest.mark.parametrize("version", ["2.12.1", "3.0.0", "1.7.1"])
def test_a_torch_outside_the_range_is_one_line(version):
    with pytest.raises(ImportError, match=f"innet.torch needs torch >= 2.13 and < 3 .*not {version}"):
        check_torch(version)
    check_torch("2.13.0+cpu")


def test_a_work_not_done_within_its_timeout_fails_as_gloos_and_a_late_end_is_ignored():
    """A call the other ranks never make: ``wait()`` raises after the group's timeout (gloo's words, "Timed out",
    which torch's barrier-timeout tests match), and the result arriving afterwards changes nothing."""
    future = torch.futures.Future()
    work = InnetWork(future, "barrier", timedelta(seconds=0.2))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^innet: barrier: Timed out waiting 200ms for the group's other ranks$"):
        work.wait()
    assert 0.2 <= time.monotonic() - start < 2 and work.is_completed() and not work.is_success()
    settle(future, [torch.ones(1)])  # the call's late end
    with pytest.raises(RuntimeError, match="Timed out"):
        future.wait()
    done = torch.futures.Future()
    in_time = InnetWork(done, "barrier", timedelta(seconds=0.2))
    settle(done, [torch.ones(1)])
    assert in_time.wait() and in_time.is_success() and in_time.result() == [torch.ones(1)]
