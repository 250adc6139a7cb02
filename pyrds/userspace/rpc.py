"""Wire format between an RDS client socket and the stack service.

Control connection: AF_UNIX SOCK_SEQPACKET. A request is ``marshal((op, args))``, a response
``marshal((errno, result))`` (errno 0 = success). Records larger than :data:`CHUNK` are split into several
seqpackets; the first byte of each packet says whether more follow. Only plain values (ints, bytes, str,
tuples, lists, None) cross the wire, so ``marshal`` is enough (local, same-user peers).
"""

from __future__ import annotations

import array
import enum
import marshal
import select
import socket
from typing import Any

CHUNK = 60 * 1024
SEND_TIMEOUT = 5.0
_MORE = b"\x01"
_LAST = b"\x00"


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


#: reply code: a blocking sender must wait for the destination port to uncongest (not an errno)
WAIT_CONG = 100000


class ConnectionClosed(EOFError):
    pass


def encode(value: Any) -> bytes:
    return marshal.dumps(value)


def decode(raw: bytes) -> Any:
    try:
        return marshal.loads(raw)
    except (EOFError, ValueError, TypeError) as exc:
        raise ConnectionClosed(f"bad record: {exc}") from None


def send_record(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    """Send one record (blocking socket); ``fds`` ride on the first packet with SCM_RIGHTS."""
    view = memoryview(payload)
    first = True
    while True:
        part = view[:CHUNK]
        view = view[CHUNK:]
        head = _MORE if len(view) else _LAST
        anc = []
        if first and fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        while True:
            try:
                sock.sendmsg([head, part], anc)
                break
            except BlockingIOError:  # non-blocking service side: wait (bounded) for the client to read
                if not select.select([], [sock], [], SEND_TIMEOUT)[1]:
                    raise TimeoutError("control peer does not read") from None
        first = False
        if not len(view):
            return


def recv_record(sock: socket.socket, want_fds: int = 0) -> tuple[bytes, list[int]]:
    """Receive one whole record (blocking); returns (payload, fds)."""
    parts: list[bytes] = []
    fds: list[int] = []
    while True:
        if want_fds:
            data, anc, _flags, _addr = sock.recvmsg(CHUNK + 1, socket.CMSG_SPACE(4 * want_fds))
            for level, kind, blob in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    arr = array.array("i")
                    arr.frombytes(blob[: len(blob) - len(blob) % arr.itemsize])
                    fds.extend(arr)
            want_fds = 0
        else:
            data = sock.recv(CHUNK + 1)
        if not data:
            raise ConnectionClosed("stack service closed the control connection")
        parts.append(data[1:])
        if data[:1] == _LAST:
            return b"".join(parts), fds


class Reassembler:
    """Non-blocking record reassembly for the service side (one per control connection)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, packet: bytes, limit: int = 4 << 20) -> bytes | None:
        self._parts.append(packet[1:])
        self._size += len(packet) - 1
        if self._size > limit:
            raise ConnectionClosed("record too large")
        if packet[:1] == _MORE:
            return None
        out = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        return out


def packets(payload: bytes) -> list[bytes]:
    """A record split into the seqpackets the service queues for a non-blocking send."""
    out: list[bytes] = []
    for off in range(0, max(len(payload), 1), CHUNK):
        part = payload[off : off + CHUNK]
        out.append((_MORE if off + CHUNK < len(payload) else _LAST) + part)
    return out
