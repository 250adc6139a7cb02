"""``struct rds_header`` (48 bytes, big-endian) and its extension headers.

Layout: 0 be64 h_sequence | 8 be64 h_ack | 16 be32 h_len | 20 be16 h_sport | 22 be16 h_dport |
24 u8 h_flags | 25 u8 h_credit | 26 u8 h_padding[4] | 30 u16 h_csum | 32 u8 h_exthdr[16].

Extension headers follow net/rds/message.c: one type byte then a body whose size is implied by the
type (``rds_exthdr_size[]``).  Type 0 or a type >= ``RDS_EXTHDR_MAX`` (16) ends the list, as does an
extension whose body would overrun the 16-byte area.  Types below 16 that the kernel table does not list
(4, 7, 9..15; and 8 before 7.x) have size 0: the kernel returns them as empty extensions and keeps parsing,
and so does :func:`decode_exthdrs`.
``RDS_EXTHDR_SPORT_IDX`` (8, 7.x) has a 1-byte body (0). A 6.1/6.12 receiver sizes type 8 as 0 bytes, so a
SPORT_IDX placed last is followed by its 0x00 body, which such a receiver reads as the NONE terminator.
The header checksum (rds.h ``rds_message_make_checksum`` / ``rds_message_verify_checksum``) is the IP checksum
of the 48 bytes with ``h_csum`` zero; 0 means "no checksum". RDS/IB computes and verifies it; RDS/TCP sends 0
and never checks it (the TCP code of this package does not call these functions).
6.1/6.12 senders put at most one extension in a message (``rds_message_add_extension`` refuses a second);
7.x senders put several (the probe: NPATHS, GEN_NUM, SPORT_IDX); receivers parse as many as fit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pyrds.constants import RDS_EXTHDR_MAX, RDS_EXTHDR_SIZE, RDS_HEADER_SIZE, ExtHeaderType
from pyrds.userspace.proto.errors import ProtocolError

__all__ = [
    "EXTHDR_BODY_SIZE",
    "ExtHeader",
    "ProtocolError",
    "RDSHeader",
    "checksum_ok",
    "decode_exthdrs",
    "encode_exthdrs",
    "exthdr_body_size",
    "header_checksum",
    "with_checksum",
]

_HDR = struct.Struct(">QQIHHBB4sH16s")
assert _HDR.size == RDS_HEADER_SIZE

#: Body size per extension type (net/rds/message.c ``rds_exthdr_size``); unlisted types < 16 have size 0.
EXTHDR_BODY_SIZE: dict[int, int] = {
    ExtHeaderType.NONE: 0,
    ExtHeaderType.VERSION: 4,  # struct rds_ext_header_version { __be32 h_version; }
    ExtHeaderType.RDMA: 4,  # struct rds_ext_header_rdma { __be32 h_rdma_rkey; }
    ExtHeaderType.RDMA_DEST: 8,  # struct rds_ext_header_rdma_dest { __be32 rkey; __be32 offset; }
    ExtHeaderType.NPATHS: 2,  # __be16
    ExtHeaderType.GEN_NUM: 4,  # __be32
    ExtHeaderType.SPORT_IDX: 1,  # u8 dummy (7.x); 0 bytes on 6.1/6.12
}


def exthdr_body_size(ext_type: int) -> int:
    """Body size the kernel implies for ``ext_type`` (0..15)."""
    if not 0 <= ext_type < RDS_EXTHDR_MAX:
        raise ValueError(f"extension type {ext_type} out of range 0..{RDS_EXTHDR_MAX - 1}")
    return EXTHDR_BODY_SIZE.get(ext_type, 0)


@dataclass(frozen=True, slots=True)
class ExtHeader:
    """One extension header: ``type`` (1..15) and its raw big-endian ``body``."""

    type: int
    body: bytes = b""

    def __post_init__(self) -> None:
        if not 1 <= self.type < RDS_EXTHDR_MAX:
            raise ValueError(f"extension type {self.type} out of range 1..{RDS_EXTHDR_MAX - 1}")
        if len(self.body) != exthdr_body_size(self.type):
            raise ValueError(f"extension type {self.type} needs a {exthdr_body_size(self.type)}-byte body")

    @classmethod
    def version(cls, version: int) -> ExtHeader:
        return cls(ExtHeaderType.VERSION, struct.pack(">I", version))

    @classmethod
    def rdma(cls, rkey: int) -> ExtHeader:
        return cls(ExtHeaderType.RDMA, struct.pack(">I", rkey))

    @classmethod
    def rdma_dest(cls, rkey: int, offset: int) -> ExtHeader:
        return cls(ExtHeaderType.RDMA_DEST, struct.pack(">II", rkey, offset))

    @classmethod
    def npaths(cls, npaths: int) -> ExtHeader:
        return cls(ExtHeaderType.NPATHS, struct.pack(">H", npaths))

    @classmethod
    def gen_num(cls, gen_num: int) -> ExtHeader:
        return cls(ExtHeaderType.GEN_NUM, struct.pack(">I", gen_num))

    @classmethod
    def sport_idx(cls) -> ExtHeader:
        """``RDS_EXTHDR_SPORT_IDX``: its presence is the message; the body is a zero byte."""
        return cls(ExtHeaderType.SPORT_IDX, b"\0")

    @property
    def values(self) -> tuple[int, ...]:
        """The body as host integers: (version,), (rkey,), (rkey, offset), (npaths,), (gen_num,), (0,) for
        SPORT_IDX, or ()."""
        if len(self.body) == 1:
            return (self.body[0],)
        if len(self.body) == 8:
            return struct.unpack(">II", self.body)
        if len(self.body) == 4:
            return struct.unpack(">I", self.body)
        if len(self.body) == 2:
            return struct.unpack(">H", self.body)
        return ()


_NO_EXTHDRS = bytes(RDS_EXTHDR_SIZE)


def encode_exthdrs(exts: tuple[ExtHeader, ...] | list[ExtHeader]) -> bytes:
    """The 16-byte ``h_exthdr`` area: each extension, then a NONE terminator if room is left."""
    if not exts:
        return _NO_EXTHDRS
    out = bytearray()
    for ext in exts:
        out.append(ext.type)
        out += ext.body
    if len(out) > RDS_EXTHDR_SIZE:
        raise ValueError(f"extension headers need {len(out)} bytes, only {RDS_EXTHDR_SIZE} available")
    return bytes(out).ljust(RDS_EXTHDR_SIZE, b"\0")


def decode_exthdrs(area: bytes) -> tuple[ExtHeader, ...]:
    """Parse ``h_exthdr`` exactly like repeated ``rds_message_next_extension`` calls (never raises)."""
    exts: list[ExtHeader] = []
    pos = 0
    end = min(len(area), RDS_EXTHDR_SIZE)
    while pos < end:
        ext_type = area[pos]
        pos += 1
        if ext_type == ExtHeaderType.NONE or ext_type >= RDS_EXTHDR_MAX:
            break
        size = exthdr_body_size(ext_type)
        if pos + size > end:
            break
        exts.append(ExtHeader(ext_type, bytes(area[pos : pos + size])))
        pos += size
    return tuple(exts)


#: the fields :meth:`RDSHeader.encode` range-checks, with their widths (those of ``_HDR``)
_FIELD_BITS = (
    ("sequence", 64),
    ("ack", 64),
    ("length", 32),
    ("sport", 16),
    ("dport", 16),
    ("flags", 8),
    ("credit", 8),
    ("csum", 16),
)


def _check(name: str, value: int, bits: int) -> None:
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name}={value} does not fit in {bits} bits")


@dataclass(frozen=True, slots=True)
class RDSHeader:
    """Decoded ``struct rds_header``; ``length`` is ``h_len`` (payload bytes that follow)."""

    sequence: int = 0
    ack: int = 0
    length: int = 0
    sport: int = 0
    dport: int = 0
    flags: int = 0
    credit: int = 0
    csum: int = 0
    exthdr: tuple[ExtHeader, ...] = ()

    def encode(self) -> bytes:
        """The 48 wire bytes (padding zero; h_csum stored big-endian, TCP always sends 0)."""
        exthdr = encode_exthdrs(self.exthdr)
        try:
            # the struct's fields have exactly the header's widths, so it refuses what _check refuses
            return _HDR.pack(
                self.sequence,
                self.ack,
                self.length,
                self.sport,
                self.dport,
                self.flags,
                self.credit,
                b"\0\0\0\0",
                self.csum,
                exthdr,
            )
        except struct.error:
            for name, bits in _FIELD_BITS:
                _check(name, getattr(self, name), bits)  # which field, as a ValueError
            raise

    @classmethod
    def decode(cls, raw: bytes | bytearray | memoryview) -> RDSHeader:
        """Decode the first 48 bytes of ``raw``; a shorter input is a :class:`ProtocolError`."""
        if len(raw) < RDS_HEADER_SIZE:
            raise ProtocolError("short_header", f"{len(raw)} < {RDS_HEADER_SIZE} bytes")
        seq, ack, length, sport, dport, flags, credit, _pad, csum, ext = _HDR.unpack_from(raw, 0)
        # a first byte of RDS_EXTHDR_NONE ends the area at once (decode_exthdrs): most messages carry none
        return cls(seq, ack, length, sport, dport, flags, credit, csum, decode_exthdrs(ext) if ext[0] else ())

    def ext(self, ext_type: int) -> ExtHeader | None:
        """The first extension of ``ext_type``, if any."""
        for e in self.exthdr:
            if e.type == ext_type:
                return e
        return None

    def with_flags(self, flags: int) -> RDSHeader:
        """A copy with ``flags`` set in addition to the current ones."""
        return RDSHeader(
            self.sequence,
            self.ack,
            self.length,
            self.sport,
            self.dport,
            self.flags | flags,
            self.credit,
            self.csum,
            self.exthdr,
        )


_CSUM_OFF = 30  # offset of h_csum


def header_checksum(raw: bytes | bytearray | memoryview) -> int:
    """RFC 1071 checksum of the first 48 bytes of ``raw`` with ``h_csum`` taken as zero (``ip_fast_csum``).

    The one's-complement sum does not depend on byte order, so the value stored big-endian gives the bytes
    a little-endian kernel stores natively.
    """
    if len(raw) < RDS_HEADER_SIZE:
        raise ProtocolError("short_header", f"{len(raw)} < {RDS_HEADER_SIZE} bytes")
    words: tuple[int, ...] = _WORDS.unpack_from(raw, 0)
    total = sum(words) - words[_CSUM_OFF // 2]
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def with_checksum(raw: bytes) -> bytes:
    """The 48-byte header ``raw`` with ``h_csum`` set (what the kernel's RDS/IB sender puts on the wire)."""
    csum = header_checksum(raw)
    return raw[:_CSUM_OFF] + csum.to_bytes(2, "big") + raw[_CSUM_OFF + 2 : RDS_HEADER_SIZE]


def checksum_ok(raw: bytes | bytearray | memoryview) -> bool:
    """``rds_message_verify_checksum``: ``h_csum`` 0 (none) or equal to the checksum of the header."""
    stored = int.from_bytes(raw[_CSUM_OFF : _CSUM_OFF + 2], "big")
    return stored == 0 or stored == header_checksum(raw)


_WORDS = struct.Struct(">24H")
assert _WORDS.size == RDS_HEADER_SIZE
