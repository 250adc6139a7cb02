"""What :class:`~.engine.IbEngine` reports besides the shared :data:`pyrds.userspace.proto.Event` kinds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyrds.userspace.proto import AckedMessage, Event

__all__ = ["IbEvent", "MessagesAcked", "RdmaCompleted", "SequenceGap"]


@dataclass(frozen=True, slots=True)
class MessagesAcked:
    """The peer's RDS-level ack (``h_ack`` or the connect private data's ack_seq) released these messages,
    oldest first (``rds_send_drop_acked``): the sender may free them."""

    messages: tuple[AckedMessage, ...]


@dataclass(frozen=True, slots=True)
class RdmaCompleted:
    """The work request of an RDMA op (``stack.rdma.RdmaOp``) completed: ``status`` is the RDS_RDMA_* status
    (``rds_ib_send_complete``: success, REMOTE_ERROR for a remote access error, OTHER_ERROR otherwise;
    flushed requests report nothing); ``data``: a successful READ's bytes."""

    op: Any
    status: int
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class SequenceGap:
    """The next message (its events follow) skips sequence numbers: the peer never sent those messages -- a
    silent RDMA op's (``rds_send_xmit`` posts only its WR, whose WRITE landed before this message by RC
    order), or cancelled ones."""


IbEvent = Event | MessagesAcked | RdmaCompleted | SequenceGap
