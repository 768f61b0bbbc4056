"""torch.distributed's backend "innet": a process group whose collectives run through the emulated network.

``import innet.torch`` registers it; ``dist.init_process_group("innet")`` (or ``dist.new_group(backend="innet")``)
makes an ``InnetGroup``. Each collective call returns a real ``Work`` at once (``wait()`` blocks on its future,
whose value is what gloo's holds) and goes, in the order the rank makes them, over the group's call plane to its
rank 0 (innet.integrations.torch.plane: one TCP connection per rank, the calls waiting at a rank sent in one
message). Rank 0 runs each call once every rank has made it, on the fabric (innet.integrations.torch.batch and
fabric: the run's topology, scheme and faults; small all-reduces in flight together fused), and hands each rank
its result. Under ``innet launch`` on Mininet the world's group runs what the switches' sum program serves from
every rank's own host instead (innet.integrations.torch.switches), in order on one thread, its messages from that
host too (innet.integrations.torch.messages), and the rest through rank 0.

Served through the network: all_reduce and reduce (SUM, AVG, MIN, MAX on floats by fixed point; SUM, MIN, MAX,
BAND, BOR, BXOR, PRODUCT on integers exactly), reduce_scatter_tensor, all_gather_into_tensor, all_gather (lists),
broadcast, barrier, and their coalesced forms; all_to_all(_single), gather, scatter, send/recv (isend, irecv, any
source) as messages between the ranks' hosts (innet.integrations.torch.p2p: rank 0 runs them on the fabric; on
Mininet each rank sends and receives its own, innet.integrations.torch.messages). Rank 0 reduces what the wire cannot carry exactly for
the values given (integers too large for it), with a warning naming it once. What it cannot carry whatever the
values (sparse tensors, half floats, a float PRODUCT) and the calls innet does not serve (list reduce_scatter,
allgather_coalesced, monitored_barrier) go to the side plane, a gloo group on the same store, itself: gloo's own
Work, values and progress, with a warning naming it once.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np
import torch
import torch.distributed as dist

from innet.hosts.p2p.wire import P2P_JOB
from innet.integrations.launch import watch
from innet.integrations.torch.batch import EXCHANGES, Inputs, Taken, compute_batch
from innet.integrations.torch.fabric import FabricCollectives, Tally
from innet.integrations.torch.forms import flat, tensor_of
from innet.integrations.torch.methods import Calls, InnetWork, settle
from innet.integrations.torch.p2p import FabricMessages
from innet.integrations.torch.plane import Call, Client, Result, Runner
from innet.integrations.torch.switches import SwitchCollectives, serves
from innet.node import codec
from innet.node.client import AllreduceClient
from innet.node.codec import read
from innet.planning.spec import MODES, RunSpec

if TYPE_CHECKING:
    from innet.integrations.torch.messages import RankMessages

TORCH_RANGE = ((2, 13), (3, 0))  # torch versions the backend takes (tested on 2.13.0): 2.13 named reduce_scatter_single
# and all_gather_single, which the group implements; its one private name is ``keeps_its_name``'s


def check_torch(version: str) -> None:
    """One clear line for a torch outside ``TORCH_RANGE``."""
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:2])
    if not TORCH_RANGE[0] <= (major, minor) < TORCH_RANGE[1]:
        raise ImportError(f"innet.torch needs torch >= 2.13 and < 3 (tested on 2.13.0), not {version}: "
                          "pip install -e '.[torch]'")


check_torch(torch.__version__)

_warned: set[str] = set()
_client_taken: list[str] = []  # the worker client's configuration, once a group has it


def side_plane_warning(what: str) -> None:
    """Warn once per process that ``what`` goes over the TCP side plane, not through the network."""
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"innet: {what} is not served through the emulated network: it goes over the TCP side plane",
                      stacklevel=3)


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


def _on_host(path: str, rank: int, size: int) -> tuple[SwitchCollectives, RankMessages] | None:
    """This rank's collectives through the switches, with the worker client on its Mininet host's interface
    (innet.integrations.launch.mininet.ClientConf), and its messages from that interface: for the first group of
    the whole world only (the client is the job's one worker; later groups go through rank 0)."""
    from innet.integrations.launch.mininet import ClientConf
    from innet.integrations.torch.messages import RankMessages

    if size != int(os.environ.get("WORLD_SIZE", size)) or _client_taken:
        return None
    _client_taken.append(path)
    conf = read(ClientConf, path)
    client = AllreduceClient(conf.spec, conf.iface, conf.mode, list(conf.ring), conf.faults)
    client.port.keep_job(P2P_JOB, keep=False)  # the messages' frames are RankMessages' own port's
    return SwitchCollectives(client, rank, size), RankMessages(conf, rank, size)


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
class InnetGroup(Calls):
    """The backend's process group (see module doc). ``mode``: the scheme its collectives run as (innet, pbox or
    ring), the launcher's ``--mode`` unless ``innet.torch.set_mode`` says otherwise."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        on_mininet = bool(os.environ.get("INNET_CLIENT"))  # innet launch on Mininet: this rank is in a host
        on_host = _on_host(os.environ["INNET_CLIENT"], rank, size) if on_mininet else None  # its ports open before
        # the side plane's group meets: no rank's first message finds another's port not yet there
        self.side: Any = dist.ProcessGroupGloo(dist.PrefixStore("innet-side", store), rank, size, timeout)
        self.switches = on_host[0] if on_host else None
        self.messages = on_host[1] if on_host else None  # this rank's messages from its own host, or through rank 0
        self.fabric = _fabric_of(size) if rank == 0 and not on_mininet else None
        self.tally: Tally | None = self.fabric.tally if self.fabric else Tally() if rank == 0 else None
        self.mode = self.fabric.run.mode if self.fabric and self.fabric.run.mode in MODES else "innet"
        self.p2p = FabricMessages(self.fabric, size, side_plane_warning) if rank == 0 else None
        handle = self.p2p.handle if self.p2p else None
        self.plane: Runner | Client = Runner(store, size, self._run, handle) if rank == 0 else Client(store, rank)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="innet") if self.switches else None  # in order
        self.pending: set[torch.futures.Future[Any]] = set()  # the calls in flight, for shutdown
        self.side_pending = []
        self.lock = threading.Lock()
        self.timeout = timeout  # a Work's wait() longer than this fails, as gloo's
        self.innet_name = ""  # torch's name of the group (``keeps_its_name``)
        self.watched = watch.watched(size)  # under innet launch: each call said in the launcher's store
        if self.tally is not None or self.messages is not None:  # a script that never destroys its group still has
            atexit.register(self.shutdown)  # its bytes counted

    def getBackendName(self) -> str:  # noqa: N802 (torch's name: DDP's logging and ``ProcessGroup.name()`` read it)
        return "innet"

    # -- rank 0: every rank's calls, run ----------------------------------------------------------------------
    def _run(self, batch: list[list[tuple[Call, np.ndarray]]]) -> list[list[tuple[Result, np.ndarray | None]]]:
        if self.fabric is not None and self.fabric.run.mode != self.mode:
            self.fabric.run = replace(self.fabric.run, mode=self.mode)
        calls: list[tuple[str, str, int, Inputs]] = []
        differ: dict[int, str] = {}
        for i, ranks in enumerate(batch):
            first = ranks[0][0]
            odd = next((r for r, (c, _) in enumerate(ranks) if c != replace(first, count=c.count)
                        or (c.count != first.count and first.name not in ("barrier", *EXCHANGES))), None)
            if odd is not None:
                differ[i] = f"innet: the ranks' calls differ: rank 0 {first}, rank {odd} {ranks[odd][0]}"
            calls.append((first.name, first.op, first.root, [v for _, v in ranks]))
        done = iter(compute_batch(self.fabric, [c for i, c in enumerate(calls) if i not in differ], side_plane_warning))
        out: list[list[tuple[Result, np.ndarray | None]]] = []
        for i, ranks in enumerate(batch):
            taken: Taken | Exception = RuntimeError(differ[i]) if i in differ else next(done)
            if isinstance(taken, Exception):
                out.append([(Result(error=str(taken)), None)] * len(ranks))
            else:
                out.append([(Result(), None) if v is None else (Result(v.dtype.str, v.size), v) for v in taken])
        return out

    # -- every rank: a call ----------------------------------------------------------------------------------
    def _collective(self, name: str, tensor: torch.Tensor, op: str = "sum", root: int = 0,
                    into: list[torch.Tensor] | None = None, result: Any = None,
                    place: Callable[[np.ndarray], None] | None = None, values: np.ndarray | None = None) -> InnetWork:
        """Run ``name`` on ``tensor`` (its ``values``, if given: an exchange's); the result this rank takes into each
        of ``into`` (default ``tensor``), or handed to ``place``; the future's value ``result`` (default ``[tensor]``)."""
        targets = [tensor] if into is None else into
        mine = flat(tensor) if values is None else values
        future: torch.futures.Future[Any] = torch.futures.Future()
        rank = self.rank()
        inference = torch.is_inference_mode_enabled()  # the results go into inference tensors as the call's mode
        if self.watched:
            watch.entered(rank)

        def done(res: Result, got: np.ndarray | None) -> None:
            try:
                if res.error:
                    raise RuntimeError(res.error)
                if got is not None:
                    with torch.inference_mode() if inference else torch.no_grad():
                        if place is not None:
                            place(got)
                        for target in targets if place is None else []:
                            target.copy_(tensor_of(got, target))
            except Exception as exc:  # noqa: BLE001 (the caller's wait() raises it)
                settle(future, error=exc)
            else:
                settle(future, [tensor] if result is None else result)
            finally:
                with self.lock:
                    self.pending.discard(future)
                if self.watched:
                    watch.left(rank)

        with self.lock:
            self.pending.add(future)
        call = Call(name, op, root, mine.dtype.str, mine.size)
        if self.pool is not None:
            self.pool.submit(self._through_switches, call, mine, done)
        else:
            self.plane.submit(call, mine, done)
        return InnetWork(future, name, self.timeout)

    def _message(self, name: str, values: np.ndarray, peer: int, tag: int,
                  place: Callable[[np.ndarray], None] | None = None) -> InnetWork:
        """A send (``values``: its bytes) or a recv (``place`` takes the bytes that came) with rank ``peer`` (-1: any)
        and ``tag``, through the network (innet.integrations.torch.p2p); its Work says where a message came from."""
        future: torch.futures.Future[Any] = torch.futures.Future()
        work = InnetWork(future, name, self.timeout)
        inference = torch.is_inference_mode_enabled()

        def done(res: Result, got: np.ndarray | None) -> None:
            try:
                if res.error:
                    raise RuntimeError(res.error)
                if place is not None and got is not None:
                    with torch.inference_mode() if inference else torch.no_grad():
                        place(got)
                work.source = res.source
            except Exception as exc:  # noqa: BLE001 (the caller's wait() raises it)
                settle(future, error=exc)
            else:
                settle(future)
            finally:
                with self.lock:
                    self.pending.discard(future)

        with self.lock:
            self.pending.add(future)
        call = Call(name, "bits", peer, values.dtype.str, values.size, tag)
        if self.messages is not None:
            self.messages.submit(call, values, done)
        else:
            self.plane.submit(call, values, done)
        return work

    def _through_switches(self, call: Call, mine: np.ndarray, done: Callable[[Result, np.ndarray | None], None]) -> None:
        """On Mininet, in order on the group's thread: what the switches serve from this rank's host, the rest
        through rank 0 (waited for, so that the calls end in order)."""
        assert self.switches is not None
        if call.name in EXCHANGES and self.messages is not None:
            self._exchange_here(call, mine, done)
            return
        if not serves(call.name, call.op, mine.dtype):
            ended = threading.Event()

            def end(res: Result, got: np.ndarray | None) -> None:
                done(res, got)
                ended.set()

            self.plane.submit(call, mine, end)
            ended.wait()
            return
        try:
            got = self.switches.run(call.name, call.op, mine, call.root)
            if self.tally is not None:
                self.tally.calls[call.name] += 1
        except Exception as exc:  # noqa: BLE001
            done(Result(error=str(exc)), None)
        else:
            done(Result(), None if got is None or call.name == "barrier" else got)

    def _exchange_here(self, call: Call, mine: np.ndarray, done: Callable[[Result, np.ndarray | None], None]) -> None:
        """On Mininet, in order on the group's thread: an exchange as this rank's own messages (RankMessages)."""
        assert self.messages is not None
        try:
            got = self.messages.exchange(call.name, call.root, mine)
        except Exception as exc:  # noqa: BLE001 (the caller's wait() raises it)
            done(Result(error=str(exc)), None)
            return
        if self.tally is not None:
            self.tally.calls[call.name] += 1
        done(Result(), got)

    def _side(self, what: str, method: str, collective: bool, *args: Any, **kwargs: Any) -> Any:
        """``what`` handed to the side plane's gloo group (``method``): its Work; a collective's said to the watch."""
        side_plane_warning(what)
        if not collective:
            return getattr(self.side, method)(*args, **kwargs)
        rank = self.rank()
        if self.watched:
            watch.entered(rank)
        work = getattr(self.side, method)(*args, **kwargs)
        try:
            future = work.get_future()
        except RuntimeError:  # gloo gives this call no future: said to have left now
            future = None
        if future is not None:
            self.side_pending[:] = [f for f in self.side_pending if not f.done()] + [future]
        if self.watched:
            if future is None:
                watch.left(rank)
            else:
                future.then(lambda _: watch.left(rank))
        return work

    def shutdown(self) -> None:
        """``destroy_process_group``: the calls in flight end, then rank 0 writes what its fabric counted."""
        with self.lock:
            pending = list(self.pending)
        for future in pending:
            try:
                future.wait()
            except Exception:  # noqa: BLE001 (its Work said so)
                pass
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.plane.close()
        if self.p2p is not None:
            self.p2p.close()
        if self.messages is not None:  # its messages through, then what this rank sent counted
            sent = self.messages.close()
            self.messages = None
            self.tally = self.tally or Tally()
            self.tally.add(sent)
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
