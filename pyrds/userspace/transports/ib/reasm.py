"""Receive-side reassembly of one RDS/IB message at a time (ib_recv.c ``rds_ib_process_recv``).

The first frame of a message fixes its header and ``remaining = h_len``; every later frame must carry the
same ``h_sequence``, ``h_len``, ``h_sport`` and ``h_dport`` (other fields, h_ack in particular, may differ)
or the connection is dropped ("fragment header mismatch"). A frame's payload must be at least
``min(remaining, 4096)`` bytes: the rule of 6.12.117 and 7.x ("RDS/IB: validate receive fragment
completions"; 6.1 subtracted 4096 whatever arrived). Bytes past ``h_len`` in the last fragment are ignored,
as the kernel copies only ``h_len`` bytes to the socket.

Userspace limit the kernel does not have: ``h_len`` above ``max_len`` (1 MiB by default, the largest message
an RDS socket can send) drops the connection before anything is buffered, so one connection holds at most one
maximum-size message.

ACK-only frames are recognised before this (by the engine) and may arrive between fragments.
"""

from __future__ import annotations

from pyrds.constants import RDS_MAX_MSG_SIZE
from pyrds.userspace.proto import ProtocolError, RDSHeader
from pyrds.userspace.transports.ib.wire import RDS_FRAG_SIZE

__all__ = ["Reassembler"]


class Reassembler:
    """Collects fragments into whole messages; raises :class:`ProtocolError` on a bad fragment."""

    def __init__(self, max_len: int = RDS_MAX_MSG_SIZE) -> None:
        self.max_len = max_len
        self._header: RDSHeader | None = None
        self._buf = bytearray()

    @property
    def in_progress(self) -> bool:
        """A message is partly received (``i_ibinc`` set)."""
        return self._header is not None

    @property
    def remaining(self) -> int:
        """Payload bytes still expected for the message in progress (``i_recv_data_rem``)."""
        return 0 if self._header is None else self._header.length - len(self._buf)

    def reset(self) -> None:
        """Forget a partial message (connection lost)."""
        self._header = None
        self._buf = bytearray()

    def feed(self, header: RDSHeader, data: bytes | memoryview) -> tuple[RDSHeader, bytes] | None:
        """One frame's header and payload bytes: the completed message, or ``None`` if more is expected."""
        first = self._header
        if first is None:
            if header.length > self.max_len:
                raise ProtocolError("msg_too_long", f"h_len {header.length} > {self.max_len}")
            first = header
        elif (header.sequence, header.length, header.sport, header.dport) != (
            first.sequence,
            first.length,
            first.sport,
            first.dport,
        ):
            raise ProtocolError(
                "frag_mismatch",
                f"fragment header mismatch: seq {header.sequence} len {header.length} "
                f"ports {header.sport}->{header.dport}, expected seq {first.sequence} len {first.length} "
                f"ports {first.sport}->{first.dport}",
            )
        remaining = first.length - len(self._buf)
        want = min(remaining, RDS_FRAG_SIZE)
        if len(data) < want:
            raise ProtocolError("short_frag", f"fragment of {len(data)} bytes, {want} expected")
        self._header = first
        self._buf += data[:want]
        if len(self._buf) < first.length:
            return None
        payload = bytes(self._buf)
        self.reset()
        return first, payload
