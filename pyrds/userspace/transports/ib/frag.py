"""A message as RDS/IB send work requests (ib_send.c ``rds_ib_xmit``, ``rds_ib_send_ack``).

Every SEND carries a copy of the 48-byte header (SGE0) and at most :data:`~.wire.RDS_FRAG_SIZE` payload bytes
(SGE1): ``ceil(h_len / 4096)`` work requests, one for an empty message, every one but the last exactly 4096
bytes. The header is identical in all of them (same h_ack, checksum computed once). The ACK-only frame is one
48-byte SEND: sequence 0, ports 0, length 0, flags 0, ``h_ack`` the last sequence received.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pyrds.userspace.proto import RDSHeader
from pyrds.userspace.proto.header import with_checksum
from pyrds.userspace.transports.ib.wire import RDS_FRAG_SIZE

__all__ = ["SendWR", "WrKind", "ack_frame", "frag_count", "fragments", "sealed_header"]


class WrKind(enum.Enum):
    DATA = "data"  # a sequenced message (also pings and pongs)
    CONG = "cong"  # the congestion map (sequence 0, not acked, not retransmitted)
    ACK = "ack"  # the ACK-only frame
    RDMA = "rdma"  # an RDMA READ/WRITE posted before its message's first SEND (``rds_ib_xmit_rdma``)


@dataclass(frozen=True, slots=True)
class SendWR:
    """One IBV_WR_SEND to post: SGE0 ``header`` (48 bytes), SGE1 ``payload`` (0..4096 bytes)."""

    wr_id: int
    kind: WrKind
    header: bytes
    payload: bytes
    signaled: bool
    solicited: bool
    #: sequence of the message (0 for ACK and congestion map frames)
    seq: int = 0
    #: index of this fragment within its message and the message's fragment count
    frag: int = 0
    nfrags: int = 1
    #: kind RDMA: the op (``stack.rdma.RdmaOp``: rkey, remote address, bytes, READ or WRITE)
    rdma: Any = None
    #: kind RDMA: no SEND of its message follows (a silent op's message: ``IbEngine._next_tx``)
    alone: bool = False

    @property
    def data(self) -> bytes:
        """What lands in the peer's receive buffer (scatter: header, then fragment)."""
        return self.header + self.payload

    @property
    def last(self) -> bool:
        return self.frag == self.nfrags - 1


def frag_count(length: int) -> int:
    """Work requests for an ``h_len`` of ``length``: ``ceil(length / 4096)``, at least 1."""
    if length < 0:
        raise ValueError("length must be >= 0")
    return max(1, -(-length // RDS_FRAG_SIZE))


def fragments(payload: bytes) -> list[bytes]:
    """``payload`` cut into the SGE1 pieces of its work requests (one empty piece for an empty message)."""
    return [payload[i * RDS_FRAG_SIZE : (i + 1) * RDS_FRAG_SIZE] for i in range(frag_count(len(payload)))]


def sealed_header(header: RDSHeader) -> bytes:
    """``header`` encoded with its checksum set (``rds_message_make_checksum``)."""
    return with_checksum(header.encode())


def ack_frame(ack: int, credit: int = 0) -> bytes:
    """The 48 bytes of an ACK-only frame acknowledging ``ack`` (ib_send.c ``rds_ib_send_ack``)."""
    return sealed_header(RDSHeader(sequence=0, ack=ack, length=0, sport=0, dport=0, flags=0, credit=credit))
