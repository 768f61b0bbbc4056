"""The ``ProcessGroup`` methods torch calls on an ``innet`` group, in every form torch's own take (a list of tensors
or one tensor; options objects, a ``ReduceOp``, ``root=``), each made of the group's two ways of running a call
(``Calls``): through the network, or handed to the side plane's gloo. Futures hold what gloo's hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from innet.integrations.torch import checks
from innet.integrations.torch.batch import carried, exchange_values
from innet.integrations.torch.forms import op_of, options, reducible, tensor_of, torch_name


def settle(future: torch.futures.Future[Any], value: Any = None, error: Exception | None = None) -> None:
    """End ``future`` with ``value`` or ``error``, unless it has ended already (a call that timed out, ending late)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except RuntimeError:  # "Future can only be marked completed once"
        if not future.done():
            raise


class InnetWork(dist.Work):
    """A collective in flight: ``wait()`` until its future has a result (raising its error, if any), at most
    ``timeout`` (the group's, as gloo's): then the call fails, its message saying what timed out as gloo's does."""

    def __init__(self, future: torch.futures.Future[Any], what: str = "", timeout: timedelta | None = None) -> None:
        super().__init__()
        self.future = future
        self.source = -1  # a receive's: the rank its message came from
        self.what, self.timeout = what, timeout
        self.ended = threading.Event()
        future.add_done_callback(lambda _: self.ended.set())

    def _source_rank(self) -> int:  # torch's name: ``dist.recv`` without a source asks it
        self.future.wait()
        return self.source

    def wait(self, timeout: timedelta | None = None) -> bool:
        limit = timeout if timeout else self.timeout
        if limit and not self.ended.wait(limit.total_seconds()):
            settle(self.future, error=RuntimeError(
                f"innet: {self.what or 'a call'}: Timed out waiting {limit.total_seconds() * 1000:.0f}ms for the "
                "group's other ranks"))
        self.future.wait()
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def is_success(self) -> bool:
        if not self.future.done():
            return False
        try:
            self.future.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def result(self) -> Any:
        return self.future.wait()

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future


def _side_call(what: str, method: str = "", collective: bool = True) -> Callable[..., Any]:
    """A process group method that hands ``what`` to the side plane's gloo group (its ``method``, default the same
    name), with every argument form gloo takes; its Work is gloo's."""

    def call(self: Calls, *args: Any, **kwargs: Any) -> Any:
        return self._side(what, method or what, collective, *args, **kwargs)

    call.__name__ = what
    return call


class Calls(dist.ProcessGroup):
    """The methods (see module doc); the group supplies ``_collective`` (through the network) and ``_side`` (the
    side plane)."""

    _collective: Callable[..., InnetWork]
    _message: Callable[..., InnetWork]
    _side: Callable[..., Any]
    side_pending: list[torch.futures.Future[Any]]  # the side plane's collectives since the last barrier

    @staticmethod
    def _reducible(tensor: torch.Tensor, op: str, name: str) -> bool:
        """Whether the network can carry ``name`` with ``op`` on ``tensor`` at all (else: the side plane)."""
        dtype = reducible(tensor.dtype)
        return not tensor.is_sparse and dtype is not None and carried(name, op, dtype)

    def allreduce(self, tensors: Any, opts: Any = None, op: Any = None, timeout: Any = None) -> Any:  # type: ignore[override]
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        checks.allreduce(tensors)
        reduce_op = op_of(opts if op is None else op)
        if not all(self._reducible(t, reduce_op, "allreduce") for t in tensors):
            return self._side(f"allreduce ReduceOp.{torch_name(reduce_op)} of {_kind(tensors[0])}", "allreduce", True,
                              tensors, options(dist.AllreduceOptions, opts, reduceOp=op, timeout=timeout))
        if len(tensors) == 1:
            return self._collective("allreduce", tensors[0], reduce_op)
        total = torch.stack([t.detach() for t in tensors]).sum(0) if reduce_op in ("sum", "avg") else None
        whole = total if total is not None else _fold(tensors, reduce_op)
        return self._collective("allreduce", whole, reduce_op, into=tensors, result=tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> InnetWork:
        checks.allreduce_coalesced(tensors)
        reduce_op = op_of(opts)
        if not all(self._reducible(t, reduce_op, "allreduce") for t in tensors):
            return self._side("allreduce_coalesced", "allreduce_coalesced", True, tensors, opts)
        return self._last([self._collective("allreduce", t, reduce_op) for t in tensors], tensors)

    def reduce(self, tensors: Any, opts: Any = None, op: Any = None, timeout: Any = None, root: Any = None) -> Any:  # type: ignore[override]
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        opts = options(dist.ReduceOptions, opts if not isinstance(opts, int) else None,
                       rootRank=opts if isinstance(opts, int) else root, reduceOp=op, timeout=timeout)
        checks.reduce(tensors, opts, self.size())
        reduce_op = op_of(opts)
        if not self._reducible(tensors[0], reduce_op, "reduce"):
            return self._side(f"reduce ReduceOp.{torch_name(reduce_op)} of {_kind(tensors[0])}", "reduce", True, tensors, opts)
        return self._collective("reduce", tensors[0], reduce_op, opts.rootRank)

    def broadcast(self, tensors: Any, opts: Any = None, root: Any = None, timeout: Any = None) -> Any:  # type: ignore[override]
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        opts = options(dist.BroadcastOptions, opts if not isinstance(opts, int) else None,
                       rootRank=opts if isinstance(opts, int) else root, timeout=timeout)
        checks.broadcast(tensors, opts, self.size())
        source = tensors[opts.rootTensor]
        return self._collective("broadcast", source, "bits", opts.rootRank, into=tensors, result=tensors)

    def barrier(self, opts: Any = None) -> InnetWork:
        """Through the network, and (as gloo's) not done before the side plane's collectives made before it."""
        work = self._collective("barrier", torch.zeros(1), into=[], result=[])
        before, self.side_pending[:] = list(self.side_pending), []
        return self._last([work, *(InnetWork(f) for f in before)], []) if before else work

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> InnetWork:
        """``reduce_scatter_tensor``."""
        reduce_op = op_of(opts)
        if not self._reducible(tensor, reduce_op, "reduce_scatter"):
            return self._side("reduce_scatter_tensor", "reduce_scatter_single", True, output, tensor, opts)
        return self._collective("reduce_scatter", tensor, reduce_op, into=[output], result=[output])

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> InnetWork:
        """``all_gather_into_tensor``: the future holds the output's pieces, rank by rank (as gloo's)."""
        return self._collective("all_gather", tensor, "bits", into=[output], result=list(output.chunk(self.size())))

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> InnetWork:
        works = [self.reduce_scatter_single(out, x, opts) for out, x in zip(outputs, inputs, strict=True)]
        return self._last(works, outputs)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> InnetWork:
        """Each input gathered into its output; the future holds, rank by rank, that rank's piece of each (gloo's)."""
        works = [self.all_gather_single(out, x, opts) for out, x in zip(outputs, inputs, strict=True)]
        pieces = [list(out.chunk(self.size())) for out in outputs]
        return self._last(works, [[p[r] for p in pieces] for r in range(self.size())])

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # type: ignore[assignment]
    all_gather_single_coalesced = allgather_into_tensor_coalesced  # type: ignore[assignment]

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> InnetWork:
        """All-gather of lists, as gloo's: this rank's inputs gathered together, every output list taking every
        rank's inputs in rank order (``outputs[i][r * len(inputs) + j]``: rank r's input j); the future holds the
        one output list, or the lists."""
        if isinstance(inputs, torch.Tensor):
            outputs, inputs = [outputs], [inputs]
        checks.allgather(outputs, inputs, self.size())
        mine = inputs[0] if len(inputs) == 1 else torch.cat([t.detach().reshape(-1) for t in inputs])
        return self._collective("all_gather", mine, "bits", place=partial(_cut_each, outputs),
                                result=outputs[0] if len(outputs) == 1 else outputs)

    def _last(self, works: list[InnetWork], value: Any) -> InnetWork:
        """One Work for ``works`` (made in order: the last ends last), its future holding ``value``."""
        futures = [w.future for w in works]
        return InnetWork(torch.futures.collect_all(futures).then(lambda f: ([x.wait() for x in f.wait()], value)[1]))

    # messages between pairs of ranks (innet.integrations.torch.p2p), raw bytes: every dtype exact
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        if tensors[0].is_sparse:
            return self._side("send of a sparse tensor", "send", False, tensors, dst, tag)
        return self._message("send", raw(tensors[0]), dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        if tensors[0].is_sparse:
            return self._side("recv of a sparse tensor", "recv", False, tensors, src, tag)
        return self._message("recv", np.zeros(0, np.uint8), src, tag, partial(_into, [tensors[0]], src))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        if tensors[0].is_sparse:
            return self._side("recv_anysource of a sparse tensor", "recv_anysource", False, tensors, tag)
        return self._message("recv", np.zeros(0, np.uint8), -1, tag, partial(_into, [tensors[0]], -1))

    def _exchange(self, name: str, sends: list[torch.Tensor | None], into: list[torch.Tensor], value: Any,
                  root: int = 0) -> InnetWork:
        """An exchange (all_to_all, gather, scatter to or from ``root``): ``sends[d]`` this rank's tensor for rank d
        (None: nothing), the bytes that come (in rank order) into ``into``, in order; the future holds ``value``."""
        payload = [raw(t) for t in sends if t is not None]
        values = exchange_values([0 if t is None else t.numel() * t.element_size() for t in sends],
                                 np.concatenate(payload) if payload else np.zeros(0, np.uint8))
        return self._collective(name, torch.zeros(0), "bits", root, place=partial(_into, into, -1), result=value,
                                values=values)

    def all_to_all_single(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> Any:
        if output.is_sparse or tensor.is_sparse:
            return self._side("all_to_all_single of a sparse tensor", "alltoall_base", True, output, tensor,
                              output_splits, input_splits, opts)
        if not (output.is_contiguous() and tensor.is_contiguous()):
            raise ValueError("Tensors must be contiguous")  # gloo's words
        rows = list(input_splits) or [tensor.shape[0] // self.size()] * self.size()
        return self._exchange("all_to_all", list(torch.split(tensor, rows)), [output], [output])

    def alltoall_base(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: list[int],
                      input_splits: list[int], opts: Any = None) -> Any:
        return self.all_to_all_single(output, tensor, output_splits, input_splits, opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        if any(t.is_sparse for t in [*outputs, *inputs]):
            return self._side("alltoall of sparse tensors", "alltoall", True, outputs, inputs, opts)
        return self._exchange("all_to_all", list(inputs), list(outputs), list(outputs))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        root = opts.rootRank if opts is not None else 0
        checks.gather(outputs, inputs, root, self.rank(), self.size())
        if inputs[0].is_sparse:
            return self._side("gather of a sparse tensor", "gather", True, outputs, inputs, opts)
        sends: list[torch.Tensor | None] = [inputs[0] if d == root else None for d in range(self.size())]
        into = list(outputs[0]) if outputs else []
        return self._exchange("gather", sends, into, into, root)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:  # type: ignore[override]
        root = opts.rootRank if opts is not None else 0
        checks.scatter(outputs, inputs, root, self.rank(), self.size())
        if outputs[0].is_sparse:
            return self._side("scatter of a sparse tensor", "scatter", True, outputs, inputs, opts)
        sends: list[torch.Tensor | None] = list(inputs[0]) if inputs else [None] * self.size()
        return self._exchange("scatter", sends, [outputs[0]], [outputs[0]], root)

    # the calls innet does not serve: the side plane's gloo, each with its one-time warning
    reduce_scatter = _side_call("reduce_scatter")
    allgather_coalesced = _side_call("allgather_coalesced")
    monitored_barrier = _side_call("monitored_barrier")


def raw(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes (any dtype), flat, as the wire carries a message (a copy taken now)."""
    t = tensor.detach().contiguous().reshape(-1)
    return np.array((t if t.dtype == torch.uint8 else t.view(torch.uint8)).numpy(), copy=True)


def _into(targets: list[torch.Tensor], src: int, got: np.ndarray) -> None:
    """Bytes that came into ``targets``, in order, each as many bytes as it holds (from ``src``, -1: any; for the
    one line a size that differs says)."""
    need = sum(t.numel() * t.element_size() for t in targets)
    if len(got) != need:
        whence = f" from rank {src}" if src >= 0 else ""
        raise RuntimeError(f"innet: expected {need} bytes{whence}, but the message(s) carried {len(got)}")
    at = 0
    for t in targets:
        n = t.numel() * t.element_size()
        piece = torch.from_numpy(np.array(got[at : at + n], np.uint8))
        t.copy_(piece.view(t.dtype).reshape(t.shape) if n else t)
        at += n


def _cut_each(lists: list[list[torch.Tensor]], whole: np.ndarray) -> None:
    """A gathered ``whole`` into each of ``lists`` (``_cut``)."""
    for parts in lists:
        _cut(parts, whole)


def _cut(parts: list[torch.Tensor], whole: np.ndarray) -> None:
    """A gathered ``whole`` into the tensors ``parts``, in order."""
    for part, piece in zip(parts, np.split(whole, len(parts)), strict=True):
        part.copy_(tensor_of(piece, part))


def _kind(tensor: torch.Tensor) -> str:
    return f"sparse {tensor.dtype}" if tensor.is_sparse else str(tensor.dtype).replace("torch.", "")


def _fold(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    """Several tensors of one rank folded into one with ``op`` (gloo reduces a list's tensors together)."""
    fns = {"min": torch.minimum, "max": torch.maximum, "prod": torch.mul, "band": torch.bitwise_and,
           "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
    out = tensors[0].detach().clone()
    for t in tensors[1:]:
        out = fns[op](out, t)
    return out
