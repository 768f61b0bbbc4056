"""Send pre-built frames as fast as the kernel takes them, with sendmmsg (for benchmarks).

``python -m scripts.blast IFACE[,IFACE...] --seconds S --kind forward|sum ...`` runs inside
a Mininet host: it builds the frames once, then hands the kernel batches of up
to 64 with one sendmmsg each, round-robin over its interfaces (paced to
``--rate`` when given), and prints how many it sent, in how many seconds, and its own CPU seconds meanwhile.
One process drives all of a benchmark's "workers", in lockstep.
With ``--native LIB`` (``native_sender()`` builds it from blast.c with the machine's cc) the same loop runs in C,
so the sender is the kernel's send path alone, not the interpreter's work between system calls.
With ``--xdp OBJ`` as well (``xdp_generator()`` builds xdpgen.bpf.c) no frame is copied from user space: one
BPF_PROG_TEST_RUN of live frames runs OBJ on copies of each port's first frame, which stamps each copy's slot,
chunk and version as blast.c's replay would and redirects it into its port's veth, frame i to port i % ports
(the far end needs NAPI: GRO on). Its work (the program, the veth's NAPI poll that makes each frame an skb, the
enqueue to the receiving core) stays on the sender's core; it sent 2.1-3.6x blast.c's frames per second there,
2.6-3.2x per second of its CPU (4 veths steered as scripts/bench_switch.py's, 256 values, loaded machine, 2026-11-29).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from innet.io.mmsg import FrameBuffer
from innet.io.rawport import RawPort
from innet.wire.packet import HEADER_DTYPE, HEADER_OFFSET, ROUTE, VER, make_packet

_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


class MultiSender:
    """sendmmsg of many equal-length frames held in one FrameBuffer."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = FrameBuffer(len(frames), len(frames[0]))
        self.frames.load(np.frombuffer(b"".join(frames), np.uint8).reshape(len(frames), -1))
        self.count = len(frames)

    def advance_chunks(self, delta: int) -> None:
        """Add ``delta`` to every frame's chunk number, so a replay is new data."""
        at = HEADER_OFFSET + HEADER_DTYPE.fields["chunk"][1]  # type: ignore[index]
        chunks = self.frames.frames[:, at:at + 4].view(">u4")
        chunks += np.uint32(delta)

    def send(self, fd: int, start: int = 0, count: int | None = None) -> int:
        return self.frames.send(fd, start, self.count - start if count is None else count)


def frames_for(kind: str, srcs: list[int], dst: int, slots: int, elements: int, rounds: int) -> list[list[bytes]]:
    """Per interface, the frames to send: routed data from ``srcs[0]`` (forward), or rank r's contributions
    from node ``srcs[r]`` to its switch ``dst`` (sum)."""
    values = np.arange(elements, dtype=np.int32)
    workers = len(srcs)
    if kind == "forward":
        return [[make_packet(values, job=1, flags=ROUTE, chunk=c).to_frame(srcs[0], dst) for c in range(rounds)]]
    out = []
    for rank in range(workers):
        out.append([make_packet(values, job=1, rank=rank, nworkers=workers, slot=c % slots, chunk=c + 1,
                                flags=VER if (c + 1) // slots % 2 else 0).to_frame(srcs[rank], dst)
                    for c in range(rounds)])
    return out


CLONE_NEWNET = 0x40000000
NATIVE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blast.c")


def native_sender(cache: str) -> str:
    """blast.c built as a shared library under ``cache`` (by the digest of its source; built now when missing,
    with the machine's cc): the path to give ``--native``."""
    with open(NATIVE_SOURCE, "rb") as fh:
        source = fh.read()
    path = os.path.join(cache, "blast", f"blast-{hashlib.sha256(source).hexdigest()[:16]}.so")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            raise RuntimeError("no C compiler (cc, gcc or clang) to build the benchmark's sender")
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
        os.close(fd)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, NATIVE_SOURCE], check=True)
        os.replace(tmp, path)
    return path


XDP_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xdpgen.bpf.c")


def xdp_generator(cache: str) -> str:
    """xdpgen.bpf.c built with clang under ``cache`` (by its source's digest): the path to give ``--xdp``."""
    with open(XDP_SOURCE, "rb") as fh:
        source = fh.read()
    path = os.path.join(cache, "blast", f"xdpgen-{hashlib.sha256(source).hexdigest()[:16]}.o")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".o", dir=os.path.dirname(path))
        os.close(fd)
        subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-I/usr/include/x86_64-linux-gnu", "-c",
                        XDP_SOURCE, "-o", tmp], check=True)
        os.replace(tmp, path)
    return path


def native_blast(lib: str, fds: list[int], senders: list[MultiSender], advance: int, seconds: float, rate: float,
                 batch: int) -> tuple[int, float]:
    """blast.c's loop over ``senders``' frames (one per port, equal counts and lengths): frames sent, seconds."""
    c = ctypes.CDLL(lib)
    c.blast.restype = ctypes.c_long
    c.blast.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                        ctypes.c_long, ctypes.c_long, ctypes.c_uint32, ctypes.c_double, ctypes.c_double, ctypes.c_int,
                        ctypes.POINTER(ctypes.c_double)]
    length = int(senders[0].frames.lengths[0])
    frames = np.ascontiguousarray(np.stack([s.frames.frames[:, :length] for s in senders]))
    chunk_at = HEADER_OFFSET + HEADER_DTYPE.fields["chunk"][1]  # type: ignore[index]
    elapsed = ctypes.c_double()
    sent = c.blast((ctypes.c_int * len(fds))(*fds), len(fds), frames.ctypes.data, frames.shape[1], length, length,
                   chunk_at, advance, seconds, rate, batch, ctypes.byref(elapsed))
    if sent < 0:
        raise MemoryError("blast.c could not allocate its headers")
    return sent, elapsed.value



class GenConfig(ctypes.Structure):
    """xdpgen.bpf.c's ``struct gen``."""

    _fields_ = [(name, ctypes.c_uint64) for name in ("slots", "rounds", "first", "sum", "nports", "rate", "start", "sent",
                                                       "duration", "hop")]


def in_namespace(where: str, call: Callable[[str], T]) -> T:
    """``call(IFACE)`` inside the network namespace of process PID for ``where`` = PID:IFACE (here for IFACE)."""
    if ":" not in where:
        return call(where)
    pid, iface = where.split(":", 1)
    with open("/proc/self/ns/net", "rb") as home, open(f"/proc/{pid}/ns/net", "rb") as there:
        if _libc.setns(there.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter the namespace of process {pid}")
        try:
            return call(iface)
        finally:
            _libc.setns(home.fileno(), CLONE_NEWNET)


def realtime_kthreads(prefix: str) -> None:
    """The kernel threads named ``prefix``... scheduled real-time (FIFO 50): a NIC queue's softirq, which they stand
    for, runs before any process on its core, loaded machine or not."""
    import subprocess

    names = subprocess.run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True, check=True).stdout.splitlines()
    pids = [int(line.split()[0]) for line in names if line.split()[1].startswith(prefix)]
    if not pids:
        raise OSError(f"no kernel thread {prefix}*")
    for pid in pids:
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(50))


def xdp_blast(lib: str, obj: str, where: list[str], templates: list[bytes], kind: str, slots: int, rounds: int,
              first: int, seconds: float, rate: float, batch: int, hop: int = -1) -> tuple[int, float, float]:
    """The ports' frames (``templates``: each port's first) made and sent in the kernel by xdpgen.bpf.c (``obj``,
    run by blast.c's ``xdp_blast`` on this core), port i's into its veth ``where[i]`` (``hop`` >= 0: by way of that
    CPU, a cpumap entry, so that the veths receive there): frames sent, seconds, and
    this process's CPU seconds while it sent (not the program's load, nor the call's setup and teardown)."""
    bpf = ctypes.CDLL("libbpf.so.1", use_errno=True)
    bpf.bpf_object__open_file.restype = ctypes.c_void_p
    bpf.bpf_object__open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    bpf.bpf_object__load.argtypes = bpf.bpf_object__close.argtypes = [ctypes.c_void_p]
    bpf.bpf_object__find_program_by_name.restype = ctypes.c_void_p
    bpf.bpf_object__find_program_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    bpf.bpf_program__fd.argtypes = [ctypes.c_void_p]
    bpf.bpf_object__find_map_fd_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    bpf.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    bpf.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    handle = bpf.bpf_object__open_file(obj.encode(), None)
    if not handle or bpf.bpf_object__load(handle):
        raise OSError(f"cannot load {obj}")
    try:
        maps = {name: bpf.bpf_object__find_map_fd_by_name(handle, name.encode())
                for name in ("gen", "heads", "out", "cpus", "port_of")}

        def put(name: str, key: int, value: ctypes.Array | ctypes.Structure) -> None:  # type: ignore[type-arg]
            if bpf.bpf_map_update_elem(maps[name], ctypes.byref(ctypes.c_uint32(key)), ctypes.byref(value), 0):
                raise OSError(ctypes.get_errno(), f"xdpgen map {name}[{key}]")

        cfg = GenConfig(slots, rounds, first, int(kind == "sum"), len(where), int(rate), 0, 0, int(seconds * 1e9), hop + 1)
        put("gen", 0, cfg)
        if hop >= 0:  # struct bpf_cpumap_val: its queue's size, the program its kthread runs
            hop_fd = bpf.bpf_program__fd(bpf.bpf_object__find_program_by_name(handle, b"innet_xdpgen_hop"))
            put("cpus", hop, (ctypes.c_uint32 * 2)(2048, hop_fd))
            realtime_kthreads(f"cpumap/{hop}/")
        for port, (w, frame) in enumerate(zip(where, templates, strict=True)):
            put("heads", port, (ctypes.c_ubyte * 64).from_buffer_copy(frame[:64]))
            if bpf.bpf_map_update_elem(maps["port_of"], ctypes.c_char_p(frame[26:30]), ctypes.byref(ctypes.c_uint32(port)), 0):
                raise OSError(ctypes.get_errno(), "xdpgen map port_of")
            in_namespace(w, lambda iface, port=port: put("out", port, ctypes.c_uint32(socket.if_nametoindex(iface))))
        c = ctypes.CDLL(lib)
        c.xdp_blast.restype = ctypes.c_long
        c.xdp_blast.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_long, ctypes.c_double, ctypes.c_int,
                                ctypes.POINTER(ctypes.c_double)]
        ended = ctypes.c_double()
        prog = bpf.bpf_program__fd(bpf.bpf_object__find_program_by_name(handle, b"innet_xdpgen"))
        cpu, wall = time.process_time(), time.monotonic()
        err = c.xdp_blast(prog, templates[0], len(templates[0]), seconds, batch, ctypes.byref(ended))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        if err < 0:
            raise OSError(-err, "BPF_PROG_TEST_RUN of live frames")
        if bpf.bpf_map_lookup_elem(maps["gen"], ctypes.byref(ctypes.c_uint32(0)), ctypes.byref(cfg)):
            raise OSError(ctypes.get_errno(), "xdpgen map gen")
        # sending began at the first frame (bpf_ktime_get_ns: CLOCK_MONOTONIC), after the call's setup, and lasted
        # seconds (unless the call ended sooner)
        sending = min(seconds, ended.value - cfg.start / 1e9) if cfg.start else 0.0
        # the call's setup and teardown (~25 ms of wall time, CPU all of it where the sender has its core) are not the
        # frames' cost; on a loaded machine, where they waited too, at most half the call's CPU is taken for them
        return int(cfg.sent), sending, max(cpu - (wall - sending), 0.5 * cpu)
    finally:
        bpf.bpf_object__close(handle)

SEND_ONLY = 0  # a packet socket of protocol 0 hears nothing


def open_port(where: str, protocol: int = SEND_ONLY) -> RawPort:
    """``IFACE`` here, or ``PID:IFACE`` inside the network namespace of process PID (a Mininet host), to send
    from: by default its socket hears nothing (one of ETH_P_ALL would get a queued copy of every frame the
    host receives, made by whichever core delivers it: in bench_switch, the switch's)."""
    return in_namespace(where, lambda iface: RawPort(iface, protocol=protocol))  # the socket stays in that namespace

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("ifaces", help="comma-separated IFACE or PID:IFACE, one per worker rank")
    p.add_argument("--kind", choices=("forward", "sum"), default="forward")
    p.add_argument("--src", required=True, help="comma-separated node index of each sender")
    p.add_argument("--dst", type=int, required=True)
    p.add_argument("--elements", type=int, default=256)
    p.add_argument("--slots", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4096,
                   help="chunks prepared (a multiple of 2 x slots), replayed with new chunk numbers")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rate", type=float, default=0.0, help="frames/s over all interfaces (0: as fast as possible)")
    p.add_argument("--first-chunk", type=int, default=0, help="added to every chunk number (a later run's data is new)")
    p.add_argument("--native", help="blast.c built as a shared library (native_sender): its loop sends")
    p.add_argument("--xdp", help="xdpgen.bpf.c built: the frames made and sent in the kernel (needs --native)")
    p.add_argument("--hop", type=int, default=-1, help="with --xdp: the frames handed to this CPU, the veths' "
                                                        "receive run there (a cpumap entry)")
    args = p.parse_args(argv)

    def report(sent: int, elapsed: float, cpu: float) -> int:
        print(f"sent {sent} {elapsed:.4f} {cpu:.4f}", flush=True)
        return 0

    names = args.ifaces.split(",")
    srcs = [int(x) for x in args.src.split(",")]
    if args.xdp:
        templates = [frames[0] for frames in frames_for(args.kind, srcs, args.dst, args.slots, args.elements, 2 * args.slots)]
        return report(*xdp_blast(args.native, args.xdp, names, templates, args.kind, args.slots, args.rounds,
                                 args.first_chunk, args.seconds, args.rate, 256, args.hop))
    ports = [open_port(n) for n in names]
    per_port = frames_for(args.kind, srcs, args.dst, args.slots, args.elements, args.rounds)
    senders = [MultiSender(frames) for frames in per_port]
    for sender in senders:
        sender.advance_chunks(args.first_chunk)
    batch = 64 if not args.rate else max(1, min(64, int(args.rate / len(ports) / 2000)))  # ~0.5 ms rounds
    cpu = time.process_time()
    if args.native:
        sent, elapsed = native_blast(args.native, [port.fileno() for port in ports], senders,
                                     args.rounds if args.kind == "sum" else 0, args.seconds, args.rate, batch)
        return report(sent, elapsed, time.process_time() - cpu)
    sent, end = 0, time.monotonic() + args.seconds
    start = time.monotonic()
    position = 0
    while time.monotonic() < end:
        if args.rate:
            ahead = start + sent / args.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        step = min(batch, senders[0].count - position)
        for port, sender in zip(ports, senders, strict=True):
            sent += sender.send(port.fileno(), position, step)
        position = (position + step) % senders[0].count
        if position == 0 and args.kind == "sum":  # a new pass: new chunks, same slots and versions
            for sender in senders:
                sender.advance_chunks(args.rounds)
    return report(sent, time.monotonic() - start, time.process_time() - cpu)


if __name__ == "__main__":
    raise SystemExit(main())
