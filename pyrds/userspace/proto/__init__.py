"""Sans-IO RDS/TCP protocol core: bytes and ``now`` in, bytes and events out.

No sockets, threads, clocks or global random state.
"""

from __future__ import annotations

from pyrds.userspace.proto.backoff import ReconnectBackoff
from pyrds.userspace.proto.cong import (
    CongestionMap,
    cong_map_header,
    encode_cong_map_message,
    is_congested,
    is_uncongested,
    next_congested_state,
)
from pyrds.userspace.proto.errors import ProtocolError
from pyrds.userspace.proto.events import (
    AckedMessage,
    CongMapDropped,
    CongMapReceived,
    DuplicateDropped,
    Event,
    MessageReceived,
    NpathsNegotiated,
    PeerGenChanged,
    PingReceived,
    PongReceived,
    UnackedMessage,
)
from pyrds.userspace.proto.framer import Frame, MessageFramer
from pyrds.userspace.proto.handshake import (
    is_hs_probe,
    jhash_1word,
    negotiate_npaths,
    path_for_port,
    peer_gen_num,
    peer_sport_idx,
    probe_exthdrs,
    should_dial,
)
from pyrds.userspace.proto.header import ExtHeader, RDSHeader, decode_exthdrs, encode_exthdrs
from pyrds.userspace.proto.path import PathEngine, PathState, SendQueueFull

__all__ = [
    "AckedMessage",
    "CongMapDropped",
    "CongMapReceived",
    "CongestionMap",
    "DuplicateDropped",
    "Event",
    "ExtHeader",
    "Frame",
    "MessageFramer",
    "MessageReceived",
    "NpathsNegotiated",
    "PathEngine",
    "PathState",
    "PeerGenChanged",
    "PingReceived",
    "PongReceived",
    "ProtocolError",
    "RDSHeader",
    "ReconnectBackoff",
    "SendQueueFull",
    "UnackedMessage",
    "cong_map_header",
    "decode_exthdrs",
    "encode_cong_map_message",
    "encode_exthdrs",
    "is_congested",
    "is_hs_probe",
    "is_uncongested",
    "jhash_1word",
    "negotiate_npaths",
    "next_congested_state",
    "path_for_port",
    "peer_gen_num",
    "peer_sport_idx",
    "probe_exthdrs",
    "should_dial",
]
