"""The control connection's value encoding: plain values (None, bool, int, float, bytes, str, tuple, list,
dict) in a fixed, bounded binary form, written here so that no foreign byte reaches ``marshal`` or ``pickle``.

Every value is one tag byte and its body (little-endian):

========  =========================================================================
``N``     None
``T F``   True, False
``i``     int: one length byte ``n`` (1..:data:`MAX_INT_BYTES`), ``n`` bytes two's complement
``d``     float: 8 bytes IEEE 754
``b``     bytes: u32 length, the bytes
``s``     str: u32 length, UTF-8 (strict)
``t l``   tuple, list: u32 count, the items
``m``     dict: u32 count, key then value for each item
========  =========================================================================

:func:`decode` checks every length against what is left of the record, nests at most :data:`MAX_DEPTH`
containers and at most :data:`MAX_ITEMS` items in all, and refuses trailing bytes; anything else is a
:class:`ValueError` naming the offset. Nothing it accepts can make the reader allocate more than the record's
own size plus a bounded overhead per item.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT_BYTES", "MAX_ITEMS", "decode", "encode"]

MAX_DEPTH = 8
MAX_ITEMS = 65536
MAX_INT_BYTES = 32  # 256-bit integers: far beyond any socket option, info length or address

_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")


def encode(value: Any) -> bytes:
    """``value`` as bytes; TypeError for anything but the plain types above (int and str subclasses such as
    IntEnum count as their base type; bytearray and memoryview as bytes)."""
    out = bytearray()
    _put(out, value, 0)
    return bytes(out)


def _put(out: bytearray, value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None:
        out += b"N"
    elif value is True:
        out += b"T"
    elif value is False:
        out += b"F"
    elif isinstance(value, int):
        n = max(1, (int(value).bit_length() + 8) // 8)
        if n > MAX_INT_BYTES:
            raise OverflowError("int too large for the control connection")
        out += b"i" + bytes((n,)) + int(value).to_bytes(n, "little", signed=True)
    elif isinstance(value, float):
        out += b"d" + _F64.pack(value)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out += b"b" + _U32.pack(len(raw)) + raw
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += b"s" + _U32.pack(len(raw)) + raw
    elif isinstance(value, (tuple, list)):
        out += (b"t" if isinstance(value, tuple) else b"l") + _U32.pack(len(value))
        for item in value:
            _put(out, item, depth + 1)
    elif isinstance(value, dict):
        out += b"m" + _U32.pack(len(value))
        for k, v in value.items():
            _put(out, k, depth + 1)
            _put(out, v, depth + 1)
    else:
        raise TypeError(f"cannot send {type(value).__name__} over the control connection")


def decode(raw: bytes | bytearray | memoryview) -> Any:
    """The value in ``raw`` (exactly one, nothing after it); ValueError for anything malformed."""
    view = memoryview(raw).cast("B") if not isinstance(raw, memoryview) else raw.cast("B")
    reader = _Reader(view)
    value = reader.value(0)
    if reader.pos != len(view):
        raise ValueError(f"{len(view) - reader.pos} trailing bytes at offset {reader.pos}")
    return value


class _Reader:
    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0
        self.items = 0

    def _take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.view):
            raise ValueError(f"record truncated at offset {self.pos} (needs {n} bytes)")
        part = self.view[self.pos : end]
        self.pos = end
        return part

    def _u32(self) -> int:
        n: int = _U32.unpack(self._take(4))[0]
        return n

    def _count(self) -> int:
        n = self._u32()
        self.items += n
        if self.items > MAX_ITEMS:
            raise ValueError(f"more than {MAX_ITEMS} items")
        if n > len(self.view) - self.pos:  # every item takes at least one byte
            raise ValueError(f"count {n} at offset {self.pos} exceeds the record")
        return n

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} at offset {self.pos}")
        tag = self._take(1)[0]
        if tag == 0x4E:  # N
            return None
        if tag == 0x54:  # T
            return True
        if tag == 0x46:  # F
            return False
        if tag == 0x69:  # i
            n = self._take(1)[0]
            if not 1 <= n <= MAX_INT_BYTES:
                raise ValueError(f"int of {n} bytes at offset {self.pos}")
            return int.from_bytes(self._take(n), "little", signed=True)
        if tag == 0x64:  # d
            f: float = _F64.unpack(self._take(8))[0]
            return f
        if tag == 0x62:  # b
            return bytes(self._take(self._u32()))
        if tag == 0x73:  # s
            try:
                return str(self._take(self._u32()), "utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"bad UTF-8 at offset {self.pos}: {exc.reason}") from None
        if tag in (0x74, 0x6C):  # t, l
            items = [self.value(depth + 1) for _ in range(self._count())]
            return tuple(items) if tag == 0x74 else items
        if tag == 0x6D:  # m
            out: dict[Any, Any] = {}
            for _ in range(self._count()):
                key = self.value(depth + 1)
                try:
                    hash(key)
                except TypeError:
                    raise ValueError(f"unhashable dict key at offset {self.pos}") from None
                out[key] = self.value(depth + 1)
            return out
        raise ValueError(f"unknown tag {tag:#04x} at offset {self.pos - 1}")
