"""A fixed-schema, bounded encoding of the values a test node exchanges with a node in another machine
(:mod:`pyrds.testing.peeragent`): never pickle or marshal, because the bytes cross a network.

One value is a tag byte and its body:

=====  ============================================================================================
``N``  None
``T``  True; ``F``: False
``i``  int: a length byte (1..17) and that many bytes, big-endian two's complement (|value| < 2**128)
``f``  float: 8 bytes, IEEE 754 big-endian
``s``  str: a 4-byte length (at most :data:`MAX_STR`) and UTF-8
``b``  bytes: a 4-byte length (at most :data:`MAX_BYTES`) and the bytes
``l``  list, ``t``: tuple: a 4-byte count (at most :data:`MAX_ITEMS`) and the items
``d``  dict: a 4-byte count (at most :data:`MAX_ITEMS`) and key, value pairs (keys of a hashable kind)
``a``  an IPv4 or IPv6 address: a length byte (4 or 16) and the packed address
``R``  an RDS_INFO record (:mod:`pyrds.info`): the 4-byte table number and the record in the kernel's layout
       (exactly :func:`pyrds.info.record_size` bytes); a table pyrds does not know is refused
=====  ============================================================================================

Nesting is at most :data:`MAX_DEPTH` deep and a frame at most :data:`MAX_FRAME` bytes. :func:`decode` raises
ValueError for anything else (an unknown tag, a length past the end or over its bound, trailing bytes,
invalid UTF-8, an unhashable key); :func:`encode` raises TypeError for a value of another kind and ValueError
for one over a bound. Subclasses of int (enums, flags) are sent as plain ints.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from typing import Any

from pyrds import info

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_FRAME", "MAX_ITEMS", "MAX_STR", "decode", "encode"]

#: the largest bytes value (a 1 MiB RDS message with room to spare) and str value
MAX_BYTES = 2 << 20
MAX_STR = 64 << 10
#: items of one list, tuple or dict, and how deep values nest
MAX_ITEMS = 4096
MAX_DEPTH = 16
#: one encoded value in all
MAX_FRAME = 4 << 20
_INT_BYTES = 17

_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")

#: record class -> the first table that carries it (any table of the class round-trips its records)
_TABLE_OF: dict[type[Any], int] = {}
for _t, (_cls, _st) in info.TABLES.items():
    _TABLE_OF.setdefault(_cls, int(_t))


def encode(value: Any) -> bytes:
    out = bytearray()
    _encode(value, out, 0)
    if len(out) > MAX_FRAME:
        raise ValueError(f"encoded value of {len(out)} bytes is over {MAX_FRAME}")
    return bytes(out)


def _encode(value: Any, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    if value is None:
        out += b"N"
    elif value is True or value is False:
        out += b"T" if value else b"F"
    elif isinstance(value, int):
        n = int(value)
        if not -(1 << 128) < n < (1 << 128):
            raise ValueError("int out of range (|value| < 2**128)")
        size = max(1, (n.bit_length() + 8) // 8)
        out += b"i" + bytes([size]) + n.to_bytes(size, "big", signed=True)
    elif isinstance(value, float):
        out += b"f" + _F64.pack(value)
    elif isinstance(value, str):
        raw = value.encode()
        if len(raw) > MAX_STR:
            raise ValueError(f"str of {len(raw)} bytes is over {MAX_STR}")
        out += b"s" + _U32.pack(len(raw)) + raw
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"bytes of {len(raw)} is over {MAX_BYTES}")
        out += b"b" + _U32.pack(len(raw)) + raw
    elif isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        packed = value.packed
        out += b"a" + bytes([len(packed)]) + packed
    elif isinstance(value, list | tuple):
        if len(value) > MAX_ITEMS:
            raise ValueError(f"{len(value)} items is over {MAX_ITEMS}")
        out += (b"l" if isinstance(value, list) else b"t") + _U32.pack(len(value))
        for item in value:
            _encode(item, out, depth + 1)
    elif isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            raise ValueError(f"{len(value)} items is over {MAX_ITEMS}")
        out += b"d" + _U32.pack(len(value))
        for key, item in value.items():
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    elif type(value) in _TABLE_OF:
        table = _TABLE_OF[type(value)]
        out += b"R" + _U32.pack(table) + info.encode_record(table, value)
    elif isinstance(value, enum.Enum):
        raise TypeError(f"cannot encode the non-int enum {value!r}")
    else:
        raise TypeError(f"cannot encode a {type(value).__name__}")
    if len(out) > MAX_FRAME:
        raise ValueError(f"encoded value is over {MAX_FRAME} bytes")


def decode(data: bytes | bytearray | memoryview) -> Any:
    view = memoryview(data)
    if len(view) > MAX_FRAME:
        raise ValueError(f"frame of {len(view)} bytes is over {MAX_FRAME}")
    value, end = _decode(view, 0, 0)
    if end != len(view):
        raise ValueError(f"{len(view) - end} trailing bytes")
    return value


def _take(view: memoryview, pos: int, n: int) -> tuple[memoryview, int]:
    if n < 0 or pos + n > len(view):
        raise ValueError(f"truncated: {n} bytes wanted at offset {pos}, {len(view) - pos} left")
    return view[pos : pos + n], pos + n


def _length(view: memoryview, pos: int, bound: int, what: str) -> tuple[int, int]:
    raw, pos = _take(view, pos, 4)
    (n,) = _U32.unpack(raw)
    if n > bound:
        raise ValueError(f"{what} of {n} is over {bound}")
    return n, pos


def _decode(view: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    tag_raw, pos = _take(view, pos, 1)
    tag = bytes(tag_raw)
    if tag == b"N":
        return None, pos
    if tag in (b"T", b"F"):
        return tag == b"T", pos
    if tag == b"i":
        size_raw, pos = _take(view, pos, 1)
        size = size_raw[0]
        if not 1 <= size <= _INT_BYTES:
            raise ValueError(f"int of {size} bytes")
        raw, pos = _take(view, pos, size)
        n = int.from_bytes(raw, "big", signed=True)
        if not -(1 << 128) < n < (1 << 128):
            raise ValueError("int out of range")
        return n, pos
    if tag == b"f":
        raw, pos = _take(view, pos, 8)
        return _F64.unpack(raw)[0], pos
    if tag == b"s":
        n, pos = _length(view, pos, MAX_STR, "str")
        raw, pos = _take(view, pos, n)
        try:
            return bytes(raw).decode(), pos
        except UnicodeDecodeError as exc:
            raise ValueError(f"str is not UTF-8: {exc}") from None
    if tag == b"b":
        n, pos = _length(view, pos, MAX_BYTES, "bytes")
        raw, pos = _take(view, pos, n)
        return bytes(raw), pos
    if tag == b"a":
        size_raw, pos = _take(view, pos, 1)
        if size_raw[0] not in (4, 16):
            raise ValueError(f"address of {size_raw[0]} bytes")
        raw, pos = _take(view, pos, size_raw[0])
        return ipaddress.ip_address(bytes(raw)), pos
    if tag in (b"l", b"t"):
        n, pos = _length(view, pos, MAX_ITEMS, "list")
        items = []
        for _ in range(n):
            item, pos = _decode(view, pos, depth + 1)
            items.append(item)
        return (items if tag == b"l" else tuple(items)), pos
    if tag == b"d":
        n, pos = _length(view, pos, MAX_ITEMS, "dict")
        out: dict[Any, Any] = {}
        for _ in range(n):
            key, pos = _decode(view, pos, depth + 1)
            try:
                hash(key)
            except TypeError:
                raise ValueError(f"unhashable dict key of type {type(key).__name__}") from None
            out[key], pos = _decode(view, pos, depth + 1)
        return out, pos
    if tag == b"R":
        raw, pos = _take(view, pos, 4)
        (table,) = _U32.unpack(raw)
        if table not in info.TABLES:
            raise ValueError(f"unknown RDS_INFO table {table}")
        raw, pos = _take(view, pos, info.record_size(table))
        return info.parse_info(table, bytes(raw))[0], pos
    raise ValueError(f"unknown tag {tag!r} at offset {pos - 1}")
