"""rdma_cm connect private data of RDS/IB (ib.h ``rds_ib_connect_private`` / ``rds6_ib_connect_private``).

Layout (big-endian): the two addresses from the *sender's* point of view (``saddr`` = the sender's own RDS
address, ``daddr`` = the receiver's), then ``struct rds_ib_conn_priv_cmn`` (24 bytes):
major u8, minor u8, minor_mask be16, tos u8, 3 reserved bytes, ack_seq be64, credit be32, 4 bytes padding.
IPv4 is 4+4+24 = 32 bytes, IPv6 16+16+24 = 56 bytes. Which one applies is decided by the listener that took
the REQ (18634: IPv4, 16385: IPv6), never by the bytes.

rdma_cm hands the consumer the whole area of the CM message (56 bytes for a REQ, 196 for a REP), zero padded,
without the length the sender used; :meth:`ConnectPrivate.parse` therefore accepts anything from the
struct's size up to :data:`~.wire.CM_PRIVATE_DATA_MAX` bytes and ignores the rest. It raises ``ValueError``
for anything shorter, longer or otherwise unusable, and never any other exception.

Divergence: the kernel's ``rds_ib_protocol_compatible`` accepts data shorter than the struct as version 4.0
(and then reads the fields from rdma_cm's padded buffer); rdma_cm never delivers such data, so here it is
rejected as malformed.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from pyrds.userspace.transports.ib.wire import (
    CM_PRIVATE_DATA_MAX,
    RDS_IB_SUPPORTED_PROTOCOLS,
    REJ_INCOMPAT,
    version,
)

__all__ = [
    "ConnectPrivate",
    "IPAddress",
    "PROTOCOL_3_1",
    "PROTOCOL_4_0",
    "PROTOCOL_4_1",
    "REJ_CONSUMER_DATA",
    "negotiate",
    "propose",
    "reply_version",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

PROTOCOL_3_1 = version(3, 1)
PROTOCOL_4_0 = version(4, 0)
PROTOCOL_4_1 = version(4, 1)

#: what the kernel puts in every REJ (``rdma_reject(..., &err, sizeof(int), ...)`` with err = 1, x86)
REJ_CONSUMER_DATA = struct.pack("<i", REJ_INCOMPAT)

_CMN = struct.Struct(">BBHB3xQI4x")
_V4 = struct.Struct(">4s4s")
_V6 = struct.Struct(">16s16s")
assert _CMN.size == 24 and _V4.size + _CMN.size == 32 and _V6.size + _CMN.size == 56


@dataclass(frozen=True, slots=True)
class ConnectPrivate:
    """One side's private data. ``saddr``/``daddr`` are both IPv4 or both IPv6."""

    saddr: IPAddress
    daddr: IPAddress
    major: int = 3
    minor: int = 1
    minor_mask: int = RDS_IB_SUPPORTED_PROTOCOLS
    tos: int = 0
    ack_seq: int = 0
    credit: int = 0

    def __post_init__(self) -> None:
        if self.saddr.version != self.daddr.version:
            raise ValueError("saddr and daddr must be of the same family")
        for name, value, bits in (
            ("major", self.major, 8),
            ("minor", self.minor, 8),
            ("minor_mask", self.minor_mask, 16),
            ("tos", self.tos, 8),
            ("ack_seq", self.ack_seq, 64),
            ("credit", self.credit, 32),
        ):
            if not 0 <= value < (1 << bits):
                raise ValueError(f"{name}={value} does not fit in {bits} bits")

    @property
    def ipv6(self) -> bool:
        return self.saddr.version == 6

    @property
    def version(self) -> int:
        return version(self.major, self.minor)

    @staticmethod
    def size(ipv6: bool) -> int:
        """32 (IPv4) or 56 (IPv6)."""
        return (_V6.size if ipv6 else _V4.size) + _CMN.size

    def pack(self) -> bytes:
        addrs = (_V6 if self.ipv6 else _V4).pack(self.saddr.packed, self.daddr.packed)
        cmn = _CMN.pack(self.major, self.minor, self.minor_mask, self.tos, self.ack_seq, self.credit)
        return addrs + cmn

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, *, ipv6: bool) -> ConnectPrivate:
        """Decode what rdma_cm delivered (the struct, possibly followed by the rest of the CM area)."""
        try:
            raw = bytes(data)
        except (TypeError, ValueError, BufferError) as exc:
            raise ValueError(f"private data is not bytes: {exc}") from None
        need = cls.size(ipv6)
        if len(raw) < need:
            raise ValueError(f"private data of {len(raw)} bytes, {need} needed")
        if len(raw) > CM_PRIVATE_DATA_MAX:
            raise ValueError(f"private data of {len(raw)} bytes, more than any CM message carries")
        addr_struct = _V6 if ipv6 else _V4
        sraw, draw = addr_struct.unpack_from(raw, 0)
        major, minor, mask, tos, ack_seq, credit = _CMN.unpack_from(raw, addr_struct.size)
        make = ipaddress.IPv6Address if ipv6 else ipaddress.IPv4Address
        return cls(make(sraw), make(draw), major, minor, mask, tos, ack_seq, credit)


def propose(saddr: IPAddress, daddr: IPAddress, ack_seq: int = 0, tos: int = 0) -> ConnectPrivate:
    """What an active side sends, as a 6.1/6.12 kernel: version 3.1 (``c_proposed_version``), minor mask
    0x0003, no credits (flow control off), ``ack_seq`` the last sequence received from this peer."""
    return ConnectPrivate(saddr, daddr, 3, 1, RDS_IB_SUPPORTED_PROTOCOLS, tos, ack_seq, 0)


def negotiate(data_len: int, major: int, minor: int, minor_mask: int) -> int:
    """The passive side's decision (ib_cm.c ``rds_ib_protocol_compatible``): the version to accept with,
    or 0 to reject (with :data:`REJ_CONSUMER_DATA`).

    No private data: reject. Major 0: 4.0 (an old peer that sent no version). Major 4 with a minor mask
    sharing bits with 0x0003: 4.0 + the highest common bit. Exactly 3.1: 3.1. Anything else: reject.
    """
    if data_len == 0:
        return 0
    if major == 0:
        return PROTOCOL_4_0
    if major == 4:
        common = minor_mask & RDS_IB_SUPPORTED_PROTOCOLS
        if common:
            return version(4, common.bit_length() - 1)
    if (major, minor) == (3, 1):
        return PROTOCOL_3_1
    return 0


def reply_version(rep: ConnectPrivate, proposed_local: int = PROTOCOL_4_1) -> int:
    """The version an active side adopts from the REP (ib_cm.c ``rds_ib_cm_connect_complete``): the REP's
    major.minor unless major is 0 (then the local ``c_version``, 4.1 after ``rds_ib_cm_initiate_connect``).
    Below 3.1 is no longer supported: ``ValueError`` (the connection is dropped)."""
    chosen = rep.version if rep.major else proposed_local
    if chosen < PROTOCOL_3_1:
        raise ValueError(f"peer chose protocol {chosen >> 8}.{chosen & 0xFF}, no longer supported")
    return chosen
