"""Wire format between an RDS client socket and the stack service.

Control connection: AF_UNIX SOCK_SEQPACKET. Every packet starts with one byte saying whether more packets of
the same record follow; a record larger than one packet is split (:func:`packet_limit` bytes each, at most
:data:`MAX_PACKET`, so a 64 KiB message crosses in one packet).

Records: the data path has compact binary records, the rest is :mod:`pyrds.userspace.values` (a fixed,
bounded encoding of plain values; no foreign byte ever reaches ``marshal`` or ``pickle``):

- ``SEND`` request: :data:`SEND_REQ` (tag, flags, mode bits, destination length, port, ancillary length), the
  packed destination address, ``values(ancdata)`` (only when there is any) and the payload, which the
  client passes to ``sendmsg`` as its own buffer (no copy in Python). Reply: :data:`SEND_REP` (code, bytes).
- ``RECV`` request: :data:`RECV_REQ` (tag, bufsize, ancbufsize, flags, nonblock). Reply: :data:`RECV_REP`
  (code, msg_flags, source port, scope id, address length, ancillary length), the packed source address,
  ``values(ancdata)`` and the data.
- ``CONSUMED`` notice: :data:`CONSUMED`, never answered (see ``service/datachannel.py``).
- ``POST`` notice: a SEND request with tag :data:`TAG_POST` and no ancillary data, never answered: a send the
  client made without waiting, under a grant from an earlier SEND reply (see ``service/posting.py``).
- anything else: request ``values((op, args))``, reply ``values((errno, result))``. Such a record starts
  with a value tag (an ASCII letter), never a binary tag byte. Only plain values (ints, floats, bytes, str,
  tuples, lists, dicts, None) cross; int subclasses such as ``IntEnum``/``IntFlag`` travel as ``int``.

Reply codes: 0 success, an errno, or :data:`WAIT_CONG`.
"""

from __future__ import annotations

import array
import enum
import select
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

from pyrds.userspace import values

CHUNK = 60 * 1024  # packet size that always fits (the default AF_UNIX send buffer is 208 KiB)
MAX_PACKET = 256 * 1024  # no packet is larger: receive buffers hold one whole packet
SOCK_SNDBUF = 512 * 1024  # asked for on control sockets (capped by net.core.wmem_max, doubled by the kernel)
SEND_TIMEOUT = 5.0
MORE = 1
LAST = 0
_MORE = b"\x01"
_LAST = b"\x00"

Buffer = bytes | bytearray | memoryview


class Op(enum.IntEnum):
    OPEN = 1
    BIND = 2
    CONNECT = 3
    SEND = 4
    RECV = 5
    SETSOCKOPT = 6
    GETSOCKOPT = 7
    GETSOCKNAME = 8
    GETPEERNAME = 9
    INFO = 10
    SET_TOS = 11
    GET_TOS = 12
    SYSCTL_GET = 13
    SYSCTL_SET = 14
    DEBUG = 15
    STATUS = 16
    STOP = 17
    NO_IDLE_EXIT = 18
    #: the read end of the socket's send waker (service/sendwaker.py), passed with the reply
    SEND_WAKER = 19


#: reply code: a blocking sender must wait for the destination port to uncongest (not an errno)
WAIT_CONG = 100000

#: first byte of a binary record (a values record starts with an ASCII letter, never one of these)
TAG_SEND = 0x01
TAG_RECV = 0x02
#: tag, flags, mode, len(packed daddr) (0 = none), dport, len(values(ancdata)) (0 = none)
SEND_REQ = struct.Struct("<BiBBHI")
#: bits of SEND_REQ's mode byte: a non-blocking send; a blocking send asking again after it waited for a
#: congested port (rds_cong_wait counts cong_send_blocked once per call, not once per ask). Others: EINVAL.
SEND_NONBLOCK = 0x01
SEND_WAITED = 0x02
#: code, bytes sent, post grant: the socket's post epoch when the client may post further sends to the same
#: destination without waiting (while the page's epoch is unchanged), else -1
SEND_REP = struct.Struct("<iqq")
#: a send posted under a grant (:data:`SEND_REQ` layout, no ancillary data), never answered
TAG_POST = 0x04
#: tag, bufsize, ancbufsize, flags, nonblock
RECV_REQ = struct.Struct("<BqqiB")
#: code, msg_flags, sport, scope_id, len(packed saddr) (0 = none), len(values(ancdata))
RECV_REP = struct.Struct("<iiHIBI")
#: a notice: the client read ``count`` pushed messages from its data channel (0: see its report page,
#: :data:`REPORT_PAGE`, which holds every read it made); ``drained``: it then found the
#: channel empty and emptied its readiness fd (the last message was the tail of the queue); ``reply``: answer
#: it with a SEND_REP (the shared page asked for synchronous reads), else no reply; ``ready_taken``: the bytes
#: the client ever took from its readiness fd, mod 2**32 (with those the service sent and took itself, the
#: service knows the fd is empty without reading it). CONSUMED_V1 (no ``ready_taken``) is still accepted.
TAG_CONSUMED = 0x03
CONSUMED = struct.Struct("<BIBBI")
CONSUMED_V1 = struct.Struct("<BIBB")
#: one pushed message on the data channel: data length, source port, scope id, len(packed saddr), flags
#: (:data:`PUSH_TAIL`, :data:`PUSH_BYTE_FOLLOWS`), the packed source address (16 bytes, the first len used);
#: then the data
PUSH_HDR = struct.Struct("<IHIBB16s")
#: push flag: nothing else was readable when it was pushed (the tail of the queue)
PUSH_TAIL = 0x01
#: push flag: the readiness fd was empty and the service makes it readable for this message right after the
#: push (a readable fd always gets its byte before a push, so this is the one byte a client that reads the
#: message at once may find not there yet): a client that empties the fd after reading this tail waits for
#: that byte and takes it, instead of leaving it to arrive after its read (a stale POLLIN: the next recv
#: found the fd readable, the channel empty, and asked the service)
PUSH_BYTE_FOLLOWS = 0x02
#: size of the page a socket's service shares with the client: byte 0 = report reads synchronously; at
#: :data:`PAGE_QUEUED_AT` how many messages the socket's receive queue ever took, at
#: :data:`PAGE_SERVED_AT` how many of them left it by request (not from the data channel), each a
#: :data:`PAGE_COUNT`. The stack writes
#: them before the readiness fd or any reply shows the change: a client that read ``n`` messages from its
#: channel knows the queue holds ``queued - served - n``, though its notices are not taken yet.
#: For posted sends: at :data:`PAGE_RELEASED_AT` how many bytes ever left the socket's send buffer (acked,
#: cancelled), at :data:`PAGE_EMPTY_RELEASED_AT` how many empty messages ever left it (the stack holds at
#: most the send buffer's size of them in flight), at :data:`PAGE_SNDBUF_AT` the send buffer the grant was
#: made for, at :data:`PAGE_EPOCH_AT` the post epoch (a grant is void once it differs from the one the SEND
#: reply gave). The stack writes the epoch last.
#: While byte 0 is 1, at :data:`PAGE_SYNC_AT` the point from which a read must be reported synchronously: a
#: client counts every message it read from its channel as its length plus :data:`PAGE_SYNC_MSG_COST`
#: (the stack's per-message receive charge), and reports a read synchronously when its count after that read
#: reaches this value (the first read that can uncongest the port or let a held transport read again); the
#: reads before it are reported without waiting. The stack writes it before byte 0.
SHARED_PAGE = 4096
#: shared page byte :data:`PAGE_NOTIFY_AT`: while it is 1 a client with a report page sends a CONSUMED notice
#: (count 0) after each read from its channel, without waiting: the stack holds messages the channel had no
#: room for, and only a read makes room
PAGE_NOTIFY_AT = 1
#: size of the report page: the client's side of its reads, which it maps read-write and the stack only reads
#: (every value in it is checked, never believed): at :data:`REPORT_READ_AT` how many messages it ever read
#: from its data channel, at :data:`REPORT_TAKEN_AT` how many bytes it ever took from its readiness fd, each
#: a :data:`PAGE_COUNT`, written in that order after each read. The stack looks at it whenever what it does
#: next depends on the socket's receive queue (a delivery, any request of the client, an info table, a
#: poll state it sets): a read that changes nothing anyone sees costs the client no system call.
REPORT_PAGE = 4096
REPORT_READ_AT = 0
REPORT_TAKEN_AT = 8
REPORT_COUNTS = struct.Struct("<QQ")
PAGE_COUNT = struct.Struct("<Q")
PAGE_QUEUED_AT = 8
PAGE_SERVED_AT = 16
PAGE_RELEASED_AT = 24
PAGE_SNDBUF_AT = 32
PAGE_EPOCH_AT = 40
PAGE_EMPTY_RELEASED_AT = 48
PAGE_SYNC_AT = 56
PAGE_SYNC_MSG_COST = 256
#: reply code of a RECV request: messages were pushed since the client looked; read the data channel first
RETRY_PUSHED = 100001


class ConnectionClosed(EOFError):
    pass


def plain(value: Any) -> Any:
    """``value`` with int subclasses (IntEnum, IntFlag) turned into int, recursively; bools stay bools."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def encode(value: Any) -> bytes:
    return values.encode(value)


def decode(raw: Buffer) -> Any:
    """The value of a record; :class:`ConnectionClosed` (the caller drops that connection) if malformed."""
    try:
        return values.decode(raw)
    except ValueError as exc:
        raise ConnectionClosed(f"bad record: {exc}") from None


def tune(sock: socket.socket) -> int:
    """Raise the control socket's send buffer; returns the packet size this side may send."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCK_SNDBUF)
    except OSError:
        pass
    try:
        sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    except OSError:
        return CHUNK
    # unix_dgram_sendmsg refuses len > sk_sndbuf - 32; keep a margin
    return min(MAX_PACKET, max(CHUNK, sndbuf - 4096))


def _sendmsg(sock: socket.socket, parts: Sequence[Buffer], anc: list[tuple[int, int, bytes]]) -> None:
    while True:
        try:
            sock.sendmsg(parts, anc)
            return
        except BlockingIOError:  # non-blocking service side: wait (bounded) for the client to read
            if not select.select([], [sock], [], SEND_TIMEOUT)[1]:
                raise TimeoutError("control peer does not read") from None


def send_record(
    sock: socket.socket, payload: Buffer, fds: list[int] | None = None, limit: int = CHUNK
) -> None:
    """Send one record (blocking socket, or a service socket with a bounded wait); ``fds`` ride on the
    first packet with SCM_RIGHTS."""
    view = memoryview(payload).cast("B") if not isinstance(payload, bytes) else memoryview(payload)
    first = True
    step = limit - 1
    while True:
        part = view[:step]
        view = view[step:]
        anc = []
        if first and fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        _sendmsg(sock, [_MORE if len(view) else _LAST, part], anc)
        first = False
        if not len(view):
            return


def send_parts(sock: socket.socket, parts: Sequence[Buffer], limit: int = CHUNK) -> None:
    """Send one record made of ``parts`` (gathered by the kernel when it fits one packet: no join)."""
    total = 1
    for p in parts:
        total += len(p) if type(p) is bytes else memoryview(p).nbytes
    if total <= limit:
        _sendmsg(sock, [_LAST, *parts], [])
    else:
        send_record(sock, b"".join(parts), None, limit)


_local = threading.local()


def _buffer() -> memoryview:
    """This thread's receive buffer (one packet); what is read into it is used before the next read."""
    buf: memoryview | None = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(bytearray(MAX_PACKET + 1))
    return buf


def recv_record(sock: socket.socket, want_fds: int = 0) -> tuple[Buffer, list[int]]:
    """Receive one whole record (blocking); returns (payload, fds). A one-packet record comes back as a view
    of this thread's receive buffer, valid until the thread's next receive."""
    parts: list[bytes] = []
    fds: list[int] = []
    buf = _buffer()
    while True:
        if want_fds:
            data, anc, _flags, _addr = sock.recvmsg(MAX_PACKET + 1, socket.CMSG_SPACE(4 * want_fds))
            for level, kind, blob in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    arr = array.array("i")
                    arr.frombytes(blob[: len(blob) - len(blob) % arr.itemsize])
                    fds.extend(arr)
            want_fds = 0
            n = len(data)
            view: memoryview = memoryview(data)
        else:
            n = sock.recv_into(buf)
            view = buf[:n]
        if not n:
            raise ConnectionClosed("stack service closed the control connection")
        if view[0] == LAST:
            if not parts:
                return view[1:], fds
            parts.append(bytes(view[1:]))
            return b"".join(parts), fds
        parts.append(bytes(view[1:]))


def request(
    sock: socket.socket, op: int, args: Any, limit: int = CHUNK, want_fds: int = 0
) -> tuple[int, Any, list[int]]:
    """One control call on a blocking socket: send ``(op, args)``, read the reply record; returns
    (errno or 0, result, received fds). Transport errors (ConnectionClosed, OSError) propagate."""
    send_record(sock, encode((int(op), args)), None, limit)
    raw, fds = recv_record(sock, want_fds)
    code, result = decode(raw)
    return code, result, fds


class Reassembler:
    """Non-blocking record reassembly for the service side (one per control connection)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def pending(self) -> bool:
        return bool(self._parts)

    def feed(self, packet: Buffer, limit: int = 4 << 20) -> Buffer | None:
        """A packet (flag byte first); the whole record once its last packet came. A one-packet record is
        returned as is (a view of ``packet`` when it is one)."""
        if packet[0] == LAST and not self._parts:
            return memoryview(packet)[1:]
        self._parts.append(bytes(packet[1:]))
        self._size += len(packet) - 1
        if self._size > limit:
            raise ConnectionClosed("record too large")
        if packet[0] == MORE:
            return None
        out = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        return out
