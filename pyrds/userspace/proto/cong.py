"""Congestion maps: one bit per port, 8192 bytes (net/rds/cong.c), and the receive-buffer thresholds.

Bit for port ``p`` is byte ``p >> 3``, bit ``p & 7`` (LSB first: ``set_bit_le``).  On TCP the map travels as a
message with ``h_flags == CONG_BITMAP``, sequence 0, ports 0 and ``h_len == 8192``.
"""

from __future__ import annotations

from pyrds.constants import RDS_CONG_MAP_BYTES, HeaderFlag
from pyrds.userspace.proto.errors import ProtocolError
from pyrds.userspace.proto.header import RDSHeader

__all__ = [
    "CongestionMap",
    "cong_map_header",
    "encode_cong_map_message",
    "is_congested",
    "is_uncongested",
    "next_congested_state",
]

_NPORTS = RDS_CONG_MAP_BYTES * 8


def _check_port(port: int) -> None:
    if not 0 <= port < _NPORTS:
        raise ValueError(f"port {port} out of range 0..{_NPORTS - 1}")


class CongestionMap:
    """A mutable 65536-bit port bitmap."""

    __slots__ = ("_bits",)

    def __init__(self) -> None:
        self._bits = bytearray(RDS_CONG_MAP_BYTES)

    def set(self, port: int) -> None:
        _check_port(port)
        self._bits[port >> 3] |= 1 << (port & 7)

    def clear(self, port: int) -> None:
        _check_port(port)
        self._bits[port >> 3] &= ~(1 << (port & 7)) & 0xFF

    def test(self, port: int) -> bool:
        _check_port(port)
        return bool(self._bits[port >> 3] & (1 << (port & 7)))

    def ports(self) -> list[int]:
        """Every congested port, ascending."""
        # over a bytes copy: mypyc (benchmarks/compiled_tree.py) cannot compile one over a bytearray
        bits = bytes(self._bits)
        return [i * 8 + b for i, byte in enumerate(bits) if byte for b in range(8) if byte >> b & 1]

    def to_bytes(self) -> bytes:
        return bytes(self._bits)

    @classmethod
    def from_bytes(cls, raw: bytes | bytearray | memoryview) -> CongestionMap:
        if len(raw) != RDS_CONG_MAP_BYTES:
            raise ProtocolError("bad_cong_map_len", f"{len(raw)} != {RDS_CONG_MAP_BYTES} bytes")
        m = cls()
        m._bits[:] = raw
        return m

    def copy(self) -> CongestionMap:
        return CongestionMap.from_bytes(self._bits)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CongestionMap) and self._bits == other._bits

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CongestionMap(congested={self.ports()[:16]})"

    @staticmethod
    def changed_ports(old: CongestionMap, new: CongestionMap) -> list[int]:
        """Ports whose bit differs between ``old`` and ``new``, ascending."""
        out: list[int] = []
        for i, (a, b) in enumerate(zip(old._bits, new._bits, strict=True)):
            diff = a ^ b
            if diff:
                out.extend(i * 8 + bit for bit in range(8) if diff >> bit & 1)
        return out


def is_congested(queued: int, rcvbuf: int) -> bool:
    """recv.c ``rds_recv_rcvbuf_delta``: congested once queued bytes > ``rds_sk_rcvbuf`` = sk_rcvbuf / 2.

    ``rcvbuf`` is the socket's SO_RCVBUF value as getsockopt reports it (already doubled by the core).
    """
    return queued > rcvbuf // 2


def is_uncongested(queued: int, rcvbuf: int) -> bool:
    """The kernel's hysteresis: a congested port clears only when queued < ``rds_sk_rcvbuf / 2``."""
    return queued < (rcvbuf // 2) // 2


def uncongest_budget(queued: int, rcvbuf: int) -> int:
    """Bytes that may leave a congested queue of ``queued`` bytes before it is uncongested
    (:func:`is_uncongested` holds only once more than this left); 0 when it already is."""
    return max(0, queued - (rcvbuf // 2) // 2)


def next_congested_state(congested: bool, queued: int, rcvbuf: int) -> bool:
    """New ``rs_congested`` after the receive queue changed to ``queued`` bytes."""
    if not congested and is_congested(queued, rcvbuf):
        return True
    if congested and is_uncongested(queued, rcvbuf):
        return False
    return congested


def cong_map_header() -> RDSHeader:
    return RDSHeader(sequence=0, length=RDS_CONG_MAP_BYTES, flags=HeaderFlag.CONG_BITMAP)


def encode_cong_map_message(cmap: CongestionMap) -> bytes:
    """Header + bitmap as sent on path 0 after connect and on every local map change."""
    return cong_map_header().encode() + cmap.to_bytes()
