"""One codec for every record that crosses a process boundary: a dataclass to plain JSON and back.

The controller writes node configurations (innet.node.config) as JSON files and talks to switches in
JSON lines; the node processes read them back as the very dataclasses that were written. ``to_json``
turns a dataclass (nested ones, tuples, dicts, None) into JSON values; ``from_json(cls, data)`` reads
them back by ``cls``'s type hints: JSON's string keys become the ``int`` keys a ``dict[int, ...]``
field declares, lists become the tuples (or sets) a field declares. No type has a hand-written codec of its own.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def to_json(value: Any) -> Any:
    """``value`` (a dataclass, or what one holds) as JSON values: fields in declaration order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(to_json(v) for v in value)
    return value


def from_json(cls: type[T], data: Any) -> T:
    """The ``cls`` that ``to_json`` wrote as ``data``."""
    return typing.cast(T, _read(cls, data))


def write(path: str, value: Any) -> None:
    """Write ``value`` to ``path`` as JSON (a node's configuration file)."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(to_json(value), fh)


def read(cls: type[T], path: str) -> T:
    with open(path, encoding="utf-8") as fh:
        return from_json(cls, json.load(fh))


@cache
def _hints(cls: type) -> dict[str, object]:
    return get_type_hints(cls)


def _read(tp: Any, data: Any) -> Any:
    if tp is Any or data is None:
        return data
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _read(options[0], data)
        for option in options:  # a plain union (int | str, float | None...): the JSON value's own type fits
            if isinstance(option, type) and isinstance(data, option):
                return data
        return data
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = _hints(tp)
        known = {f.name for f in dataclasses.fields(tp) if f.init}
        return tp(**{k: _read(hints[k], v) for k, v in data.items() if k in known})
    if origin in (dict, Mapping):
        key, val = args if args else (str, Any)
        return {_read(key, k): _read(val, v) for k, v in data.items()}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_read(args[0], v) for v in data)
        return tuple(_read(a, v) for a, v in zip(args, data, strict=True)) if args else tuple(data)
    if origin in (list, set, frozenset):
        return origin(_read(args[0] if args else Any, v) for v in data)
    if origin is collections.Counter:
        return collections.Counter({_read(args[0], k): v for k, v in data.items()})
    if tp is int and isinstance(data, str):  # a dict[int, ...]'s key
        return int(data)
    return data


def say_ready() -> None:
    """Tell the process that started this one (it reads our stdout) that we are ready: the one word of the
    protocol between a node process and its parent."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
