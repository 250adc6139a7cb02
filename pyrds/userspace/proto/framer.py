"""Split an RDS/TCP byte stream into messages (header, then ``h_len`` payload bytes, back to back).

Like ``rds_tcp_data_recv`` this accepts any chunking.  Unlike the kernel (which trusts ``h_len``) it rejects a
length above ``max_len`` before buffering anything of the payload, so buffered bytes never exceed one header
plus one maximum-size message.
"""

from __future__ import annotations

from typing import NamedTuple

from pyrds.constants import RDS_HEADER_SIZE, RDS_MAX_MSG_SIZE
from pyrds.userspace.proto.errors import ProtocolError
from pyrds.userspace.proto.header import RDSHeader

__all__ = ["Frame", "MessageFramer"]


class Frame(NamedTuple):
    header: RDSHeader
    payload: bytes


class MessageFramer:
    """Incremental deframer; after a :class:`ProtocolError` it stays failed (the stream is unusable).

    When a chunk completes some messages before hitting bad bytes, :meth:`feed` returns those messages and
    records the error in :attr:`error` (raised by the next :meth:`feed`); callers that must not wait check
    :attr:`error` after each call.
    """

    def __init__(self, max_len: int = RDS_MAX_MSG_SIZE) -> None:
        if max_len < 0:
            raise ValueError("max_len must be >= 0")
        self.max_len = max_len
        self._hbuf = bytearray()
        self._header: RDSHeader | None = None
        self._pbuf = bytearray()
        #: the error that poisoned the stream (None while it is sound); a plain attribute, read after every
        #: read of the connection
        self.error: ProtocolError | None = None

    @property
    def hdr_rem(self) -> int:
        """Header bytes still expected (``t_tinc_hdr_rem`` of rds_info_tcp_socket)."""
        return 0 if self._header is not None else RDS_HEADER_SIZE - len(self._hbuf)

    @property
    def data_rem(self) -> int:
        """Payload bytes still expected for the current message (``t_tinc_data_rem``)."""
        return 0 if self._header is None else self._header.length - len(self._pbuf)

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete message."""
        return len(self._hbuf) + len(self._pbuf)

    def reset(self) -> None:
        """Forget any partial message (new TCP connection)."""
        self._hbuf.clear()
        self._pbuf = bytearray()
        self._header = None
        self.error = None

    def _length_error(self, header: RDSHeader) -> ProtocolError | None:
        """h_len over the limit poisons the stream (the connection is dropped): remember and return it."""
        if header.length <= self.max_len:
            return None
        self.error = ProtocolError(
            "msg_too_long", f"h_len {header.length} > {self.max_len} (seq {header.sequence})"
        )
        return self.error

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Consume ``data``; return every message it completes, in stream order."""
        if self.error is not None:
            raise self.error
        frames: list[Frame] = []
        view = memoryview(data).cast("B")
        pos = 0
        end = len(view)
        while pos < end:
            if self._header is None and not self._hbuf and end - pos >= RDS_HEADER_SIZE:
                # a whole header here (the usual case): no staging copy; a whole payload: one copy
                header = RDSHeader.decode(view[pos : pos + RDS_HEADER_SIZE])
                err = self._length_error(header) if header.length > self.max_len else None
                if err is not None:
                    if frames:
                        return frames
                    raise err
                pos += RDS_HEADER_SIZE
                if end - pos >= header.length:
                    frames.append(Frame(header, bytes(view[pos : pos + header.length])))
                    pos += header.length
                    continue
                self._header = header
            elif self._header is None:
                take = min(RDS_HEADER_SIZE - len(self._hbuf), end - pos)
                self._hbuf += view[pos : pos + take]
                pos += take
                if len(self._hbuf) < RDS_HEADER_SIZE:
                    break
                header = RDSHeader.decode(self._hbuf)
                self._hbuf.clear()
                err = self._length_error(header)
                if err is not None:
                    if frames:
                        return frames
                    raise err
                if header.length == 0:
                    frames.append(Frame(header, b""))
                    continue
                self._header = header
            take = min(self._header.length - len(self._pbuf), end - pos)
            self._pbuf += view[pos : pos + take]
            pos += take
            if len(self._pbuf) == self._header.length:
                frames.append(Frame(self._header, bytes(self._pbuf)))
                self._header = None
                self._pbuf = bytearray()
        return frames
