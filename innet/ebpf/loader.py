"""One switch's eBPF data plane: its program loaded (libbpf, through ctypes), attached to every port's tc
ingress hook (and with ``xdp``, switch.c's XDP half before it on the same ports), fed the switch's plan, read
back, and detached.

Nothing is pinned: the maps live as long as this process holds them and the program stays attached, and
``close`` removes the clsact hooks it made (the run's links, deleted at its end, take any left with them).
The structs below mirror switch.c's map values field for field.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Mapping

from innet.ebpf.build import MAX_NODES, MAX_PORTS
from innet.switch.program import JobPort
from innet.switch.runtime import BANDS, PortStats, SwitchConfig

U32, U64 = ctypes.c_uint32, ctypes.c_uint64
BPF_TC_INGRESS = 1
XDP_FLAGS_DRV_MODE = 4  # the veth's own XDP (its NAPI), not the generic hook after the skb is made
BPF_MAP_TYPE_DEVMAP_HASH = 25  # switch.c's struct children_ports: a job's children's ports, fanout's inner maps
COUNTER_NAMES = ("drop:stale", "drop:duplicate", "drop:bad_count", "ebpf:answered", "ebpf:resent_up", "ebpf:routed",
                 "bad:foreign")


class Config(ctypes.Structure):
    _fields_ = [("node", U32), ("slots", U32)]


class SlotHead(ctypes.Structure):
    """The head of switch.c's ``struct slot`` (its values follow, zero when the map is made)."""

    _fields_ = [("lock", U32), ("state", U32), ("chunk", ctypes.c_int64)]


class PortInfo(ctypes.Structure):
    _fields_ = [("ifindex", U32), ("neighbor", U32)]


class JobInfo(ctypes.Structure):
    _fields_ = [(name, U32) for name in ("nworkers", "need", "parent", "is_root", "rank", "slot_base", "slots", "band",
                                         "nchildren")] + [("children", U32 * MAX_PORTS)]


class Pair(ctypes.Structure):
    _fields_ = [("a", U32), ("b", U32)]


class DevmapVal(ctypes.Structure):
    """struct bpf_devmap_val: a port's interface and the program run on each frame sent out of it."""

    _fields_ = [("ifindex", U32), ("prog_fd", ctypes.c_int)]


class TcHook(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int), ("attach_point", ctypes.c_int), ("parent", U32)]


class TcOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int), ("flags", U32), ("prog_id", U32), ("handle", U32),
                ("priority", U32)]


def _libbpf() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.bpf_object__open_file.restype = ctypes.c_void_p
    lib.bpf_object__open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.libbpf_get_error.argtypes = [ctypes.c_void_p]
    lib.libbpf_get_error.restype = ctypes.c_long
    for name in ("bpf_object__load", "bpf_object__close"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.bpf_object__find_program_by_name.restype = ctypes.c_void_p
    lib.bpf_object__find_program_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_program__fd.argtypes = [ctypes.c_void_p]
    lib.bpf_program__set_autoload.argtypes = [ctypes.c_void_p, ctypes.c_bool]
    lib.bpf_xdp_attach.argtypes = [ctypes.c_int, ctypes.c_int, U32, ctypes.c_void_p]
    lib.bpf_xdp_detach.argtypes = [ctypes.c_int, U32, ctypes.c_void_p]
    lib.bpf_object__find_map_fd_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, U64]
    lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_object__find_map_by_name.restype = ctypes.c_void_p
    lib.bpf_object__find_map_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_map__value_size.argtypes = [ctypes.c_void_p]
    lib.bpf_map_create.argtypes = [ctypes.c_int, ctypes.c_char_p, U32, U32, U32, ctypes.c_void_p]
    return lib


class EbpfPlane:
    """switch.c loaded from ``obj`` and attached to the tc ingress hook of each of ``ports`` (port -> interface),
    in this thread's network namespace (the switch's). ``xdp``: the XDP half too (innet_xdp: contributions that
    only fold are taken before the kernel makes an skb of them, and a root's result leaves by its children's ports
    as XDP frames; the rest passes on to the tc program). Those results never meet the ports' qdiscs: ``xdp`` is for
    unshaped ports (scripts/bench_switch.py's), whose far ends take XDP frames (their NAPI on: GRO)."""

    def __init__(self, obj: str, ports: Mapping[int, str], xdp: bool = False) -> None:
        self.lib = lib = _libbpf()
        if max(ports, default=0) >= MAX_PORTS:
            raise OSError(f"port {max(ports)} is past the eBPF switch's {MAX_PORTS}")
        self.obj = lib.bpf_object__open_file(obj.encode(), None)
        if not self.obj or lib.libbpf_get_error(self.obj):
            self.obj = None
            raise OSError(f"libbpf could not open {obj}")
        self.hooks: list[TcHook] = []
        self.xdp: list[int] = []  # the ifindexes the XDP half is attached to
        xdp_prog = lib.bpf_object__find_program_by_name(self.obj, b"innet_xdp")
        devmap_prog = lib.bpf_object__find_program_by_name(self.obj, b"innet_devmap")
        for half in (xdp_prog, devmap_prog):
            lib.bpf_program__set_autoload(half, xdp)
        if lib.bpf_object__load(self.obj):
            self.close()
            raise OSError(f"the kernel refused {obj} (libbpf's log is above)")
        prog = lib.bpf_object__find_program_by_name(self.obj, b"innet_switch")
        self.prog_fd = lib.bpf_program__fd(prog)
        self.xdp_fd = lib.bpf_program__fd(xdp_prog) if xdp else -1
        self.devmap_fd = lib.bpf_program__fd(devmap_prog) if xdp else -1
        self.maps = {name: lib.bpf_object__find_map_fd_by_name(self.obj, name.encode())
                     for name in ("cfg", "ports", "port_of", "routes", "jobs", "members", "towards", "pool",
                                  "stats", "counters", "fanout")}
        self.ifindex = {port: socket.if_nametoindex(name) for port, name in ports.items()}
        self.cpus = lib.libbpf_num_possible_cpus()
        try:
            for ifindex in self.ifindex.values():
                self._attach(ifindex)
            for ifindex in self.ifindex.values() if xdp else ():
                err = lib.bpf_xdp_attach(ifindex, self.xdp_fd, XDP_FLAGS_DRV_MODE, None)
                if err:
                    raise OSError(-err, f"XDP attach on ifindex {ifindex}")
                self.xdp.append(ifindex)
        except OSError:
            self.close()
            raise

    def _attach(self, ifindex: int) -> None:
        hook = TcHook(ctypes.sizeof(TcHook), ifindex, BPF_TC_INGRESS, 0)
        made = self.lib.bpf_tc_hook_create(ctypes.byref(hook))
        if made not in (0, -17):  # -EEXIST: the port had a clsact qdisc already (not ours to remove)
            raise OSError(-made, f"tc hook on ifindex {ifindex}")
        if made == 0:
            self.hooks.append(hook)
        opts = TcOpts(ctypes.sizeof(TcOpts), self.prog_fd, 0, 0, 0, 0)
        err = self.lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts))
        if err:
            raise OSError(-err, f"tc attach on ifindex {ifindex}")

    def _put(self, name: str, key: ctypes.c_uint32 | ctypes.Structure, value: ctypes.c_uint32 | ctypes.Structure) -> None:
        if self.lib.bpf_map_update_elem(self.maps[name], ctypes.byref(key), ctypes.byref(value), 0):
            raise OSError(ctypes.get_errno(), f"eBPF map {name}")

    def install(self, config: SwitchConfig, slots: int) -> None:
        """The switch's plan into the maps: its node, ports and routes, and every job it aggregates (relays'
        jobs stay with the Python switch). ``slots``: the program's pool (a version's)."""
        self._put("cfg", U32(0), Config(config.node, slots))
        self._clear_pool(2 * slots)
        for port, ifindex in self.ifindex.items():
            self._put("ports", U32(port), PortInfo(ifindex, config.neighbors.get(port, 0xFFFF)))
            self._put("port_of", U32(ifindex), U32(port))
        for node, port in config.routes.items():
            if 0 <= node < MAX_NODES:  # a destination past it is the Python switch's (none is: groups start there)
                self._put("routes", U32(node), U32(port + 1))
        for job in config.jobs.values():
            if job.aggregate:
                self._install_job(job)

    def _clear_pool(self, keys: int) -> None:
        """Every slot holding no round yet (chunk -1, as the engine's registers start), its values zero."""
        size = self.lib.bpf_map__value_size(self.lib.bpf_object__find_map_by_name(self.obj, b"pool"))
        value = ctypes.create_string_buffer(size)
        ctypes.memmove(value, ctypes.byref(SlotHead(0, 0, -1)), ctypes.sizeof(SlotHead))
        for key in range(keys):
            if self.lib.bpf_map_update_elem(self.maps["pool"], ctypes.byref(U32(key)), value, 0):
                raise OSError(ctypes.get_errno(), "eBPF map pool")

    def _install_job(self, job: JobPort) -> None:
        if len(job.contributors) > 64 or job.uplinks:
            raise OSError(f"job {job.job} needs more than the eBPF switch has (64 contributors, fixed trees)")
        children = (U32 * MAX_PORTS)(*job.children)
        info = JobInfo(job.nworkers, len(job.contributors), job.parent or 0, job.parent is None, job.rank,
                       job.slot_base, job.slots, min(max(job.priority, 0), BANDS - 1), len(job.children), children)
        self._put("jobs", U32(job.job), info)
        for index, rank in enumerate(sorted(job.contributors)):
            self._put("members", Pair(job.job, rank), Pair(index, job.contributors[rank]))
        for rank, port in job.rank_ports.items():
            self._put("towards", Pair(job.job, rank), U32(port))
        if self.xdp_fd >= 0 and job.parent is None and job.children:
            self._install_fanout(job)

    def _install_fanout(self, job: JobPort) -> None:
        """The root's children's ports for innet_xdp's result multicast: a map of its own in ``fanout``, each
        port with innet_devmap (the outer map holds the inner one; this process's fd to it is closed)."""
        fd = self.lib.bpf_map_create(BPF_MAP_TYPE_DEVMAP_HASH, b"innet_children", 4, ctypes.sizeof(DevmapVal),
                                     MAX_PORTS, None)
        if fd < 0:
            raise OSError(-fd, "eBPF map children_ports")
        try:
            for port in job.children:
                value = DevmapVal(self.ifindex[port], self.devmap_fd)
                if self.lib.bpf_map_update_elem(fd, ctypes.byref(U32(port)), ctypes.byref(value), 0):
                    raise OSError(ctypes.get_errno(), f"eBPF map children_ports (port {port})")
            self._put("fanout", U32(job.job), U32(fd))
        finally:
            os.close(fd)

    def _per_cpu(self, name: str, key: int, width: int) -> list[int]:
        """A per-CPU array's entry ``key`` (``width`` u64 fields), summed over the CPUs."""
        buf = (U64 * (width * self.cpus))()
        if self.lib.bpf_map_lookup_elem(self.maps[name], ctypes.byref(U32(key)), buf):
            return [0] * width
        return [sum(buf[cpu * width + f] for cpu in range(self.cpus)) for f in range(width)]

    def port_stats(self) -> dict[int, PortStats]:
        """Each port's frames and bytes the program took in and sent out."""
        return {port: PortStats(*self._per_cpu("stats", port, 4)) for port in self.ifindex}

    def counters(self) -> dict[str, int]:
        values = {name: self._per_cpu("counters", k, 1)[0] for k, name in enumerate(COUNTER_NAMES)}
        return {name: n for name, n in values.items() if n}

    def close(self) -> None:
        """Detach from every port (the XDP half and the clsact hooks removed) and free the programs and their maps."""
        for ifindex in self.xdp:
            self.lib.bpf_xdp_detach(ifindex, XDP_FLAGS_DRV_MODE, None)
        self.xdp = []
        for hook in self.hooks:
            hook.attach_point = BPF_TC_INGRESS | 2  # BPF_TC_EGRESS too: the whole clsact qdisc
            self.lib.bpf_tc_hook_destroy(ctypes.byref(hook))
        self.hooks = []
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None
