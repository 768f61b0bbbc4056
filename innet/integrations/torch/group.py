"""torch.distributed's backend "innet": a process group whose collectives run through the emulated network.

``import innet.torch`` registers it; ``dist.init_process_group("innet")`` (or ``dist.new_group(backend="innet")``)
makes an ``InnetGroup``. Each collective call goes, in the order the ranks issue it, to one worker thread per group
(its ``Work`` is real: ``wait()`` blocks on the call's future); there every rank hands its tensor to the group's
rank 0 over a TCP side plane (an internal gloo group on the same store), rank 0 runs the collective on the fabric
(innet.integrations.torch.fabric: the run's topology, scheme and faults) and hands each rank its result back.
Under ``innet launch`` on Mininet, the world's group runs what the switches' sum program serves from every rank's
own host instead (innet.integrations.torch.switches), and only the rest through rank 0 over the side plane.

Served through the network: all_reduce (SUM, AVG, MIN, MAX on floats by fixed point; SUM, MIN, MAX, BAND, BOR on
integers exactly), reduce_scatter_tensor, all_gather_into_tensor, all_gather (lists), broadcast, reduce, barrier.
Everything else (all_to_all, send/recv, gather, scatter, ...) and what the wire cannot carry exactly (integers too
large for it, half floats) goes over the side plane, with a warning naming it once.
"""

from __future__ import annotations

import atexit
import json
import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

import networkx as nx
import numpy as np
import torch
import torch.distributed as dist

from innet.integrations.torch import watch
from innet.integrations.torch.fabric import FabricCollectives, Tally, compute
from innet.integrations.torch.switches import SwitchCollectives, serves
from innet.node import codec
from innet.node.client import AllreduceClient
from innet.node.codec import read
from innet.planning.spec import MODES, RunSpec

TORCH_RANGE = ((2, 13), (3, 0))  # torch versions the backend takes (tested on 2.13.0): 2.13 named reduce_scatter_single
# and all_gather_single, which the group implements; its one private name is ``keeps_its_name``'s


def check_torch(version: str) -> None:
    """One clear line for a torch outside ``TORCH_RANGE``."""
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:2])
    if not TORCH_RANGE[0] <= (major, minor) < TORCH_RANGE[1]:
        raise ImportError(f"innet.torch needs torch >= 2.13 and < 3 (tested on 2.13.0), not {version}: "
                          "pip install -e '.[torch]'")


check_torch(torch.__version__)

OPS = {"SUM": "sum", "AVG": "avg", "MIN": "min", "MAX": "max", "BAND": "band", "BOR": "bor"}
_warned: set[str] = set()
_client_taken: list[str] = []  # the worker client's configuration, once a group has it


def side_plane_warning(what: str) -> None:
    """Warn once per process that ``what`` goes over the TCP side plane, not through the network."""
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"innet: {what} is not served through the emulated network: it goes over the TCP side plane",
                      stacklevel=3)


class InnetWork(dist.Work):
    """A collective in flight: ``wait()`` until its future has a result (raising its error, if any)."""

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        super().__init__()
        self.future = future

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.future.wait()
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future


def _fabric_of(size: int) -> FabricCollectives:
    """Rank 0's fabric: the launcher's run and topology (INNET_RUN, INNET_GRAPH), else a star of the group."""
    run = read(RunSpec, os.environ["INNET_RUN"]) if os.environ.get("INNET_RUN") else RunSpec(topo="star")
    graph: nx.Graph
    if os.environ.get("INNET_GRAPH"):
        from innet.shipped import load_file

        graph = load_file(os.environ["INNET_GRAPH"])
    else:
        from innet.shipped import build

        graph = build("star", workers=size)
    return FabricCollectives(graph, run)


def _switches_of(path: str, rank: int, size: int) -> SwitchCollectives | None:
    """This rank's collectives through the switches, with the worker client on its Mininet host's interface
    (innet.integrations.torch.mininet.ClientConf): for the first group of the whole world only (the client is the
    job's one worker; later groups take the side plane)."""
    from innet.integrations.torch.mininet import ClientConf

    if size != int(os.environ.get("WORLD_SIZE", size)) or _client_taken:
        return None
    _client_taken.append(path)
    conf = read(ClientConf, path)
    return SwitchCollectives(AllreduceClient(conf.spec, conf.iface, conf.mode, list(conf.ring), conf.faults), rank, size)


def _side_call(what: str, method: str = "") -> Callable[..., InnetWork]:
    """A process group method that sends ``what`` over the side plane (the gloo group's ``method``, default the
    same name)."""

    def call(self: InnetGroup, *args: Any) -> InnetWork:
        return self._side(what, *args, method=method)

    call.__name__ = what
    return call


def keeps_its_name(cls: type[dist.ProcessGroup]) -> type[dist.ProcessGroup]:
    """The backend's one private torch name (checked on torch 2.13.0): torch names every group it makes with
    ``_set_group_name``, which C++ keeps on the group's C++ backends, and FSDP and DeviceMesh read ``group_name``.
    A Python ProcessGroup has no C++ backend (its ``group_name`` fails "ProcessGroup name not set"), and torch's
    C++ Backend cannot be subclassed in Python ("No constructor defined"), so ``cls`` keeps the name itself, as
    torchft's process groups do."""

    def _set_group_name(self: Any, name: str) -> None:
        self.innet_name = name

    cls._set_group_name = _set_group_name  # type: ignore[method-assign]
    cls.group_name = property(lambda self: self.innet_name)  # type: ignore[assignment]
    return cls


@keeps_its_name
class InnetGroup(dist.ProcessGroup):
    """The backend's process group (see module doc). ``mode``: the scheme its collectives run as (innet, pbox or
    ring), the launcher's ``--mode`` unless ``innet.torch.set_mode`` says otherwise."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self.side: Any = dist.ProcessGroupGloo(dist.PrefixStore("innet-side", store), rank, size, timeout)
        on_mininet = bool(os.environ.get("INNET_CLIENT"))  # innet launch on Mininet: this rank is in a host
        self.switches = _switches_of(os.environ["INNET_CLIENT"], rank, size) if on_mininet else None
        self.fabric = _fabric_of(size) if rank == 0 and not on_mininet else None
        self.tally: Tally | None = self.fabric.tally if self.fabric else Tally() if rank == 0 else None
        self.mode = self.fabric.run.mode if self.fabric and self.fabric.run.mode in MODES else "innet"
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="innet")
        self.innet_name = ""  # torch's name of the group (``keeps_its_name``)
        self.watched = watch.watched(size)  # under innet launch: each call said in the launcher's store
        if self.tally is not None:  # a script that never destroys its group still has its bytes counted
            atexit.register(self.shutdown)

    # -- the calls, in order, on the group's worker thread --------------------------------------------------
    def _submit(self, call: Callable[[], None], result: Any) -> InnetWork:
        future: torch.futures.Future[Any] = torch.futures.Future()

        def run() -> None:
            try:
                if self.watched:
                    watch.entered(self.rank())
                call()
            except Exception as exc:  # noqa: BLE001 (the caller's wait() raises it)
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                if self.watched:
                    watch.left(self.rank())

        self.pool.submit(run)
        return InnetWork(future)

    def _exchange(self, name: str, op: str, mine: np.ndarray, out_len: int, root: int = 0) -> np.ndarray:
        """Hand rank 0 this rank's flat ``mine``; rank 0 computes every rank's result (``out_len`` values each, of
        ``mine``'s dtype) on the fabric and hands each back; this rank's result."""
        size, rank = self.size(), self.rank()
        kind = torch.from_numpy(mine[:0]).dtype
        if rank != 0:
            self.side.send([torch.from_numpy(mine)], 0, 0).wait()
            out = torch.empty(out_len, dtype=kind)
            self.side.recv([out], 0, 0).wait()
            return out.numpy()
        inputs = [mine]
        for r in range(1, size):
            got = torch.empty(len(mine), dtype=kind)
            self.side.recv([got], r, 0).wait()
            inputs.append(got.numpy())
        if self.fabric is not None:
            self.fabric.run = replace(self.fabric.run, mode=self.mode)
        results = compute(self.fabric, name, op, inputs, root, side_plane_warning)
        for r in range(1, size):
            self.side.send([torch.from_numpy(np.ascontiguousarray(results[r]))], r, 0).wait()
        return results[0]

    def _collective(self, name: str, tensor: torch.Tensor, op: str = "sum", root: int = 0, into: torch.Tensor | None = None,
                    result: Any = None) -> InnetWork:
        """Run ``name`` on ``tensor``; the result (sliced to this rank's part for reduce_scatter) into ``into``
        (default ``tensor``); rank ``root`` alone takes a reduce's."""
        target = tensor if into is None else into

        def call() -> None:
            mine = np.ascontiguousarray(tensor.detach().reshape(-1).numpy())
            got: np.ndarray | None
            if self.switches is not None and serves(name, op, mine.dtype):
                got = self.switches.run(name, op, mine, root)
                if self.tally is not None:
                    self.tally.calls[name] += 1
            else:
                got = self._exchange(name, op, mine, mine.size * (self.size() if name == "all_gather" else 1), root)
                if name == "reduce_scatter":
                    got = np.split(got, self.size())[self.rank()]
                elif name == "reduce" and self.rank() != root:
                    got = None
            if got is not None:
                with torch.no_grad():
                    target.copy_(torch.from_numpy(got).view_as(target))

        return self._submit(call, [target] if result is None else result)

    # -- torch's collectives --------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> InnetWork:  # type: ignore[override]
        return self._many("allreduce", tensors, _op(opts))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> InnetWork:  # type: ignore[override]
        return self._many("reduce", tensors, _op(opts), opts.rootRank)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> InnetWork:  # type: ignore[override]
        return self._many("broadcast", tensors, "bits", opts.rootRank)

    def barrier(self, opts: Any = None) -> InnetWork:
        return self._collective("barrier", torch.zeros(1), result=[])

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> InnetWork:
        """``reduce_scatter_tensor``."""
        return self._collective("reduce_scatter", tensor, _op(opts), into=output, result=[output])

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> InnetWork:
        """``all_gather_into_tensor``."""
        return self._collective("all_gather", tensor, "bits", into=output, result=[output])

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> InnetWork:  # type: ignore[override]
        """All-gather of lists: each input gathered whole, then cut into the output list."""
        for out, tensor in zip(outputs, inputs, strict=True):
            whole = torch.empty(len(out) * tensor.numel(), dtype=tensor.dtype)
            self._collective("all_gather", tensor, "bits", into=whole, result=whole)
            self._submit(partial(_cut, whole, out), None)
        return self._submit(lambda: None, outputs)

    def _many(self, name: str, tensors: list[torch.Tensor], op: str, root: int = 0) -> InnetWork:
        for tensor in tensors[:-1]:
            self._collective(name, tensor, op, root)
        return self._collective(name, tensors[-1], op, root, result=tensors)

    def _side(self, what: str, *args: Any, method: str = "") -> InnetWork:
        """``what`` over the side plane: the gloo group's ``method`` (default: the same name), in order."""
        side_plane_warning(what)
        return self._submit(lambda: getattr(self.side, method or what)(*args).wait(), None)

    # the calls innet does not serve: the side plane's, each with its one-time warning
    all_to_all_single = _side_call("all_to_all_single", "alltoall_base")
    alltoall_base = _side_call("alltoall_base")
    alltoall = _side_call("alltoall")
    send = _side_call("send")
    recv = _side_call("recv")
    recv_anysource = _side_call("recv_anysource")
    gather = _side_call("gather")
    scatter = _side_call("scatter")
    reduce_scatter = _side_call("reduce_scatter")
    allreduce_coalesced = _side_call("allreduce_coalesced")
    allgather_coalesced = _side_call("allgather_coalesced")

    def shutdown(self) -> None:
        """``destroy_process_group``: the calls in flight end, then rank 0 writes what its fabric counted."""
        self.pool.shutdown(wait=True)
        if self.tally is not None:
            write_tally(self.tally)
            self.tally = None
        if self.switches is not None:
            self.switches.close()
            self.switches = None


def write_tally(tally: Tally) -> None:
    """Add rank 0's counts to the launcher's file (INNET_STATS), if it gave one."""
    path = os.environ.get("INNET_STATS")
    if path:
        tally.side_plane |= _warned
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(codec.to_json(tally)) + "\n")


def _cut(whole: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """``whole`` into the tensors ``parts``, in order."""
    for part, piece in zip(parts, whole.chunk(len(parts)), strict=True):
        part.copy_(piece.view_as(part))


def _op(opts: Any) -> str:
    """innet's name of the options' ``reduceOp`` (SUM when none given)."""
    if opts is None:
        return "sum"
    for name, ours in OPS.items():
        if opts.reduceOp == getattr(dist.ReduceOp, name):
            return ours
    raise ValueError(f"innet: {opts.reduceOp} is not a reduce operator innet serves ({', '.join(OPS)})")


def set_mode(group: Any, mode: str) -> None:
    """The scheme ``group``'s collectives run as from now: innet, pbox or ring (on every rank, as for a collective)."""
    if not isinstance(group, InnetGroup):
        raise ValueError(f"innet.torch.set_mode: {group!r} is not an innet process group (backend='innet')")
    if mode not in MODES:
        raise ValueError(f"innet.torch.set_mode: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    group.mode = mode


def create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> InnetGroup:
    """torch's backend constructor (``Backend.register_backend``)."""
    return InnetGroup(store, rank, size, timeout)


def register(default: bool = False) -> None:
    """Make ``backend="innet"`` known to torch.distributed (once); with ``default``, also the backend of CPU tensors
    for ``init_process_group()`` without a backend (what ``innet launch`` does in every rank)."""
    if "innet" not in dist.Backend.backend_list:
        dist.Backend.register_backend("innet", create, devices=["cpu"])
    if default:
        dist.Backend.default_device_backend_map["cpu"] = "innet"
