"""MLCommons Chakra execution traces (``.et``), read and written without protobuf's library.

A trace is one file per rank: a ``GlobalMetadata`` message, then ``Node`` messages, each preceded by its length as
a varint (Chakra's ``protolib.encodeMessage``). The schema is Chakra's ``schema/protobuf/et_def.proto``; this module
reads the fields a replay needs (a node's id, name, type, control and data dependencies, duration, and its scalar
attributes: ``comm_type``, ``comm_size``, ``comm_src``, ``comm_dst``, ``comm_tag``, ``is_cpu_op``, ...) and skips
every other field by its wire type, as protobuf does. Lists in attributes are kept as tuples.

``write`` makes the same bytes protobuf would (fields in number order, proto3 defaults left out, a oneof's value
always written): innet.integrations.chakra.make writes ASTRA-sim's microbenchmark traces with it byte for byte.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from innet.errors import UserError

# Chakra's enums (et_def.proto)
NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE", "COMM_SEND_NODE",
              "COMM_RECV_NODE", "COMM_COLL_NODE")
COMP, SEND, RECV, COLL = 4, 5, 6, 7
COMM_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST", "ALL_TO_ALL", "REDUCE_SCATTER",
              "REDUCE_SCATTER_BLOCK", "BARRIER")
Value = int | float | bool | str | bytes | tuple[object, ...]

# AttributeProto's oneof: field number -> (name, how its value is read)
_SCALARS = {3: ("double_val", "d"), 5: ("float_val", "f"), 7: ("int32_val", "int"), 9: ("int64_val", "int"),
            11: ("uint32_val", "uint"), 13: ("uint64_val", "uint"), 15: ("sint32_val", "zigzag"),
            17: ("sint64_val", "zigzag"), 19: ("fixed32_val", "I"), 21: ("fixed64_val", "Q"), 23: ("sfixed32_val", "i"),
            25: ("sfixed64_val", "q"), 27: ("bool_val", "bool"), 29: ("string_val", "str"), 31: ("bytes_val", "bytes")}
_LISTS = {n + 1: (name.replace("_val", "_list"), how) for n, (name, how) in _SCALARS.items()}
_KIND = {int: 9, bool: 27, str: 29, float: 3, bytes: 31}  # the oneof field ``write`` gives a Python value


class Malformed(Exception):
    """Bytes that are not the message they should be (the reader's own; ``read`` makes it a ``UserError``)."""


@dataclass(frozen=True)
class Node:
    """A node of a rank's execution graph: what it is (``type``: NODE_TYPES' index), what it waits for (``ctrl_deps``,
    ``data_deps``: ids of this rank's nodes), how long it runs (``duration_micros``), and its attributes by name."""

    id: int
    name: str = ""
    type: int = 0
    ctrl_deps: tuple[int, ...] = ()
    data_deps: tuple[int, ...] = ()
    start_time_micros: int = 0
    duration_micros: int = 0
    attrs: dict[str, Value] = field(default_factory=dict)

    @property
    def deps(self) -> tuple[int, ...]:
        return self.ctrl_deps + self.data_deps

    @property
    def type_name(self) -> str:
        return NODE_TYPES[self.type] if 0 <= self.type < len(NODE_TYPES) else f"type {self.type}"

    def int_attr(self, name: str, default: int | None = None) -> int:
        """Attribute ``name`` as an integer (``default`` when the node has none), else ``Malformed``."""
        value = self.attrs.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise Malformed(f"node {self.id} ({self.name or self.type_name}) has no integer {name}")
        return value


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace: its file, the schema version its metadata names, its nodes in file order."""

    path: str
    version: str
    nodes: tuple[Node, ...]


# -- the wire format ----------------------------------------------------------------------------------------------
def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise Malformed("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift >= 70:
            raise Malformed("a varint longer than 10 bytes")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """A message's fields: (number, wire type, value: an integer for varints and fixed widths, bytes for the rest)."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed("field number 0")
        value: int | bytes
        if wire == 0:
            value, at = _varint(data, at)
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if at + width > len(data):
                raise Malformed("a fixed-width field runs past the end")
            value, at = int.from_bytes(data[at : at + width], "little"), at + width
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise Malformed(f"field {number} claims {size} bytes, {len(data) - at} are left")
            value, at = data[at : at + size], at + size
        else:
            raise Malformed(f"field {number} has wire type {wire} (groups are not in Chakra's schema)")
        yield number, wire, value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _scalar(how: str, wire: int, value: int | bytes) -> Value:
    if how in ("str", "bytes"):
        if not isinstance(value, bytes):
            raise Malformed("a string field is not length-delimited")
        return _text(value) if how == "str" else value
    if not isinstance(value, int):
        raise Malformed("a number field is length-delimited")
    if how in ("d", "f", "I", "Q", "i", "q"):
        width = 8 if how in ("d", "Q", "q") else 4
        if wire != (1 if width == 8 else 5):
            raise Malformed("a fixed-width number of the wrong width")
        number: float = struct.unpack("<" + how, value.to_bytes(width, "little"))[0]
        return number
    if wire != 0:
        raise Malformed("a varint field of another wire type")
    if how == "bool":
        return bool(value)
    if how == "zigzag":
        return (value >> 1) ^ -(value & 1)
    return _signed(value) if how == "int" else value


def _list(how: str, data: bytes) -> tuple[object, ...]:
    """A ``*List`` message's values (field 1, packed or not)."""
    out: list[object] = []
    for number, wire, value in _fields(data):
        if number != 1:
            continue
        if wire == 2 and how not in ("str", "bytes"):  # packed
            assert isinstance(value, bytes)
            out += _packed(how, value)
        else:
            out.append(_scalar(how, wire, value))
    return tuple(out)


def _packed(how: str, data: bytes) -> list[Value]:
    if how in ("d", "f", "I", "Q", "i", "q"):
        width = struct.calcsize(how)
        if len(data) % width:
            raise Malformed("a packed list of fixed-width numbers with a partial number")
        return list(struct.unpack(f"<{len(data) // width}{how}", data))
    out: list[Value] = []
    at = 0
    while at < len(data):
        value, at = _varint(data, at)
        out.append(_scalar(how, 0, value))
    return out


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("a string that is not UTF-8") from None


def _attribute(data: bytes) -> tuple[str, Value]:
    name, value = "", None
    for number, wire, raw in _fields(data):
        if number == 1:
            name = _text(raw) if isinstance(raw, bytes) else ""
        elif number in _SCALARS:
            value = _scalar(_SCALARS[number][1], wire, raw)
        elif number in _LISTS and isinstance(raw, bytes):
            value = _list(_LISTS[number][1], raw)
    if not name:
        raise Malformed("an attribute without a name")
    return name, value if value is not None else ()


def _ids(wire: int, value: int | bytes) -> list[int]:
    if isinstance(value, bytes):  # packed
        out, at = [], 0
        while at < len(value):
            dep, at = _varint(value, at)
            out.append(dep)
        return out
    if wire != 0 or not isinstance(value, int):
        raise Malformed("a dependency that is not a varint")
    return [value]


def node_of(data: bytes) -> Node:
    """A ``Node`` message's fields."""
    numbers: dict[int, int] = {}  # id, type, start_time_micros, duration_micros
    name = ""
    deps: dict[int, list[int]] = {4: [], 5: []}  # ctrl_deps, data_deps
    attrs: dict[str, Value] = {}
    seen = False
    for number, wire, value in _fields(data):
        seen = True
        if number in (1, 3, 6, 7):
            if wire != 0 or not isinstance(value, int):
                raise Malformed(f"node field {number} is not a varint")
            numbers[number] = value
        elif number == 2 and isinstance(value, bytes):
            name = _text(value)
        elif number in (4, 5):
            deps[number] += _ids(wire, value)
        elif number == 10:
            if not isinstance(value, bytes):
                raise Malformed("an attribute that is not a message")
            key, attr = _attribute(value)
            attrs[key] = attr
    if not seen:
        raise Malformed("an empty node")
    return Node(numbers.get(1, 0), name, numbers.get(3, 0), tuple(deps[4]), tuple(deps[5]), numbers.get(6, 0),
                numbers.get(7, 0), attrs)


def parse(data: bytes) -> tuple[str, tuple[Node, ...]]:
    """A trace file's bytes: its metadata's version and its nodes (``Malformed`` saying where it went wrong)."""
    messages: list[bytes] = []
    at = 0
    while at < len(data):
        start = at
        try:
            size, at = _varint(data, at)
        except Malformed:
            raise Malformed(f"a message's length at byte {start} runs past the end") from None
        if at + size > len(data):
            raise Malformed(f"the message at byte {start} claims {size} bytes, {len(data) - at} are left")
        messages.append(data[at : at + size])
        at += size
    if not messages:
        raise Malformed("no metadata and no nodes (an empty file)")
    version = ""
    try:
        for number, _, value in _fields(messages[0]):
            if number == 1 and isinstance(value, bytes):
                version = _text(value)
    except Malformed as exc:
        raise Malformed(f"the metadata: {exc}") from None
    nodes = []
    for i, message in enumerate(messages[1:]):
        try:
            nodes.append(node_of(message))
        except Malformed as exc:
            raise Malformed(f"node message {i + 1}: {exc}") from None
    return version, tuple(nodes)


def read(path: str) -> RankTrace:
    """One rank's trace file, or a one-line ``UserError`` naming it."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise UserError(f"cannot read the Chakra trace {path}: {exc.strerror or exc}") from None
    try:
        version, nodes = parse(data)
    except Malformed as exc:
        raise UserError(f"{path} is not a Chakra execution trace (.et): {exc}") from None
    return RankTrace(path, version, nodes)


_RANKED = re.compile(r"^(.*)\.(\d+)\.et$")


def trace_files(paths: Sequence[str]) -> list[str]:
    """The files of a trace, rank 0 first: one folder's ``*.et`` files, or the files given; ranked by the number
    before ``.et`` (Chakra's ``NAME.RANK.et``) where every file has one, else in the order given."""
    if not paths:
        raise UserError("innet replay needs a trace: one .et file per rank, or a folder of them")
    if len(paths) == 1 and os.path.isdir(paths[0]):
        files = sorted(os.path.join(paths[0], f) for f in os.listdir(paths[0]) if f.endswith(".et"))
        if not files:
            raise UserError(f"{paths[0]} holds no Chakra trace files (NAME.RANK.et)")
    else:
        files = list(paths)
        for f in files:
            if os.path.isdir(f):
                raise UserError(f"give one folder of .et files, or the files: {f} is a folder among other paths")
    matches = [_RANKED.match(os.path.basename(f)) for f in files]
    if all(matches):
        ranked = sorted(zip((int(m.group(2)) for m in matches if m), files, strict=True))
        ranks = [r for r, _ in ranked]
        if ranks != list(range(len(ranks))):
            raise UserError(f"the trace's files are ranks {', '.join(map(str, ranks))}: one file for each of ranks "
                            f"0..{len(ranks) - 1} is needed (NAME.RANK.et)")
        files = [f for _, f in ranked]
    return files


def load(paths: Sequence[str]) -> list[RankTrace]:
    """Every rank's trace (``trace_files``)."""
    return [read(f) for f in trace_files(paths)]


# -- writing ------------------------------------------------------------------------------------------------------
def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative numbers as protobuf writes them: ten bytes of two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _put_varint(number << 3 | wire)


def _delimited(number: int, data: bytes) -> bytes:
    return _key(number, 2) + _put_varint(len(data)) + data


def _attribute_bytes(name: str, value: Value) -> bytes:
    kind = _KIND.get(type(value))
    if kind is None:
        raise ValueError(f"attribute {name}: write takes int, bool, str, float or bytes, not {type(value).__name__}")
    out = _delimited(1, name.encode())
    if isinstance(value, float):
        return out + _key(3, 1) + struct.pack("<d", value)
    if isinstance(value, str | bytes):
        return out + _delimited(kind, value.encode() if isinstance(value, str) else value)
    assert isinstance(value, int)
    return out + _key(kind, 0) + _put_varint(value)


def node_bytes(node: Node) -> bytes:
    """A ``Node`` message as protobuf serializes it."""
    out = _key(1, 0) + _put_varint(node.id) if node.id else b""
    out += _delimited(2, node.name.encode()) if node.name else b""
    out += _key(3, 0) + _put_varint(node.type) if node.type else b""
    for number, ids in ((4, node.ctrl_deps), (5, node.data_deps)):
        if ids:
            out += _delimited(number, b"".join(_put_varint(i) for i in ids))
    for number, value in ((6, node.start_time_micros), (7, node.duration_micros)):
        if value:
            out += _key(number, 0) + _put_varint(value)
    for name, attr in node.attrs.items():
        out += _delimited(10, _attribute_bytes(name, attr))
    return out


def trace_bytes(nodes: Sequence[Node], version: str = "0.0.4") -> bytes:
    """A rank's trace file: its metadata, then its nodes, each behind its length."""
    messages = [_delimited(1, version.encode()) if version else b"", *(node_bytes(n) for n in nodes)]
    return b"".join(_put_varint(len(m)) + m for m in messages)


def write(path: str, nodes: Sequence[Node], version: str = "0.0.4") -> None:
    with open(path, "wb") as fh:
        fh.write(trace_bytes(nodes, version))


def collective_node(id: int, name: str, comm_type: str, comm_size: int, deps: tuple[int, ...] = (),
                    **attrs: Value) -> Node:
    """A COMM_COLL node of ``comm_type`` (COMM_TYPES' name) moving ``comm_size`` bytes, once its data dependencies
    ``deps`` end, as Chakra's generators make them (``is_cpu_op`` false, then ``comm_type`` and ``comm_size``)."""
    return Node(id, name, COLL, data_deps=deps, attrs={"is_cpu_op": False, "comm_type": COMM_TYPES.index(comm_type),
                                                       "comm_size": comm_size, **attrs})
