"""Events returned by ``PathEngine.feed`` and the message records of the send side."""

from __future__ import annotations

from dataclasses import dataclass

from pyrds.userspace.proto.cong import CongestionMap
from pyrds.userspace.proto.header import RDSHeader

__all__ = [
    "AckedMessage",
    "CongMapDropped",
    "CongMapReceived",
    "DuplicateDropped",
    "Event",
    "MessageReceived",
    "NpathsNegotiated",
    "PeerGenChanged",
    "PingReceived",
    "PongReceived",
    "UnackedMessage",
]


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A message for the socket bound to ``header.dport`` (regular pongs too: sport 0, as the kernel)."""

    header: RDSHeader
    payload: bytes
    rx_time: float


@dataclass(frozen=True, slots=True)
class CongMapReceived:
    """The peer's whole congestion map (replaces the previous one)."""

    map: CongestionMap


@dataclass(frozen=True, slots=True)
class CongMapDropped:
    """A CONG_BITMAP message whose h_len is not 8192: ignored like ``rds_tcp_cong_recv`` does."""

    length: int


@dataclass(frozen=True, slots=True)
class PingReceived:
    """A ping (dport 0); the engine already queued the pong if ``pong_queued``."""

    sport: int
    seq: int
    pong_queued: bool = True


@dataclass(frozen=True, slots=True)
class PongReceived:
    """The handshake pong (sport 0 -> dport RDS_FLAG_PROBE_PORT)."""

    dport: int


@dataclass(frozen=True, slots=True)
class NpathsNegotiated:
    """``c_npaths`` (1..RDS_MPATH_WORKERS) and ``c_with_sport_idx`` (the message carried SPORT_IDX) after a
    probe ping or pong."""

    npaths: int
    sport_idx: bool = False


@dataclass(frozen=True, slots=True)
class DuplicateDropped:
    """A retransmitted message with seq < next_rx_seq (``s_recv_drop_old_seq``)."""

    seq: int


@dataclass(frozen=True, slots=True)
class PeerGenChanged:
    """GEN_NUM changed: the peer restarted; sequence state and retransmit queue were reset. ``flushed``: the
    messages dropped from the retransmit queue (never resent; the sender releases them)."""

    old: int
    new: int
    flushed: tuple[AckedMessage, ...] = ()


Event = (
    MessageReceived
    | CongMapReceived
    | CongMapDropped
    | PingReceived
    | PongReceived
    | NpathsNegotiated
    | DuplicateDropped
    | PeerGenChanged
)


@dataclass(frozen=True, slots=True)
class AckedMessage:
    """A message whose last byte the peer's TCP acknowledged (the sender may free it)."""

    seq: int
    length: int
    sport: int
    dport: int
    flags: int


@dataclass(frozen=True, slots=True)
class UnackedMessage:
    """One row of the retransmit queue (RDS_INFO_RETRANS_MESSAGES / RDS_INFO_SEND_MESSAGES)."""

    seq: int
    length: int
    sport: int
    dport: int
    flags: int
