"""What :class:`~.engine.IbEngine` reports besides the shared :data:`pyrds.userspace.proto.Event` kinds."""

from __future__ import annotations

from dataclasses import dataclass

from pyrds.userspace.proto import AckedMessage, Event

__all__ = ["IbEvent", "MessagesAcked"]


@dataclass(frozen=True, slots=True)
class MessagesAcked:
    """The peer's RDS-level ack (``h_ack`` or the connect private data's ack_seq) released these messages,
    oldest first (``rds_send_drop_acked``): the sender may free them."""

    messages: tuple[AckedMessage, ...]


IbEvent = Event | MessagesAcked
