"""Socket-level helpers of the TCP transport: tuning (``rds_tcp_tune``), SIOCOUTQ, path source ports."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import random
import socket
import struct
import termios

from pyrds.userspace.proto.pathset import dial_port, sport_idx_ports

__all__ = [
    "ack_now",
    "advertised_mss",
    "bind_path_port",
    "local_port_range",
    "segments_out",
    "tune",
    "unacked_bytes",
]

_OUTQ = struct.Struct("i")


def tune(s: socket.socket, sndbuf: int = 0, rcvbuf: int = 0, user_timeout_ms: int = 0) -> None:
    """TCP_NODELAY, keepalive 5s/5/5s, rds_tcp_sndbuf/rcvbuf (rds_tcp_tune, rds_tcp_keepalive), and
    TCP_USER_TIMEOUT when ``user_timeout_ms`` > 0 (pyrds only: the setting ``rds_tcp_user_timeout_ms``)."""
    if user_timeout_ms > 0:
        with contextlib.suppress(OSError, OverflowError):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, user_timeout_ms)
    if sndbuf > 0:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    if rcvbuf > 0:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)


def ack_now(s: socket.socket) -> None:
    """TCP_QUICKACK: send a delayed ACK now (``__tcp_sock_set_quickack`` pushes one that is pending once the
    receive queue is empty). Called after every read, so the peer learns that the bytes we are about to
    deliver arrived before a reader can see them: were this process killed with the ACK still delayed, the
    peer would resend them to our next incarnation, which would deliver them a second time (a RST, which
    SIGKILL sends for a socket with unread bytes, acknowledges nothing)."""
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    except OSError:
        pass


def unacked_bytes(s: socket.socket) -> int | None:
    """SIOCOUTQ: bytes written to ``s`` that the peer's TCP has not acked (a FIN counts); None on error."""
    try:
        outq: int = _OUTQ.unpack(fcntl.ioctl(s, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return None
    return outq


_TCPI_U32 = struct.Struct("=I")
#: struct tcp_info (linux/tcp.h): tcpi_advmss at offset 84 (since 2.6); tcpi_segs_out at offset 136 (since
#: 4.2), every segment TCP transmitted on the connection, pure ACKs included (``__tcp_transmit_skb``)
_TCPI_ADVMSS_OFF = 84
_TCPI_SEGS_OUT_OFF = 136


def _tcp_info_u32(s: socket.socket, offset: int) -> int | None:
    """The u32 field of ``s``'s struct tcp_info at ``offset``; None when TCP_INFO cannot say (an error, or
    a kernel whose struct ends before it)."""
    try:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, offset + _TCPI_U32.size)
        value: int = _TCPI_U32.unpack_from(info, offset)[0]
    except (OSError, struct.error):
        return None
    return value


def advertised_mss(s: socket.socket) -> int:
    """The MSS this side advertised on ``s`` (``tcpi_advmss``: an upper bound of the receive MSS estimate
    TCP acks by, ``icsk_ack.rcv_mss``); 0 when TCP_INFO cannot say."""
    mss = _tcp_info_u32(s, _TCPI_ADVMSS_OFF)
    return mss if mss is not None and 0 < mss <= 0xFFFF else 0


def segments_out(s: socket.socket) -> int | None:
    """``tcpi_segs_out`` of ``s`` (mod 2**32); None when TCP_INFO cannot say. Every segment TCP transmits
    carries the ACK of all it had received then (``th->ack_seq = rcv_nxt``), so a count that moved after a
    read means the bytes of that read were acked."""
    return _tcp_info_u32(s, _TCPI_SEGS_OUT_OFF)


def unread_bytes(s: socket.socket) -> int:
    """SIOCINQ: bytes the peer sent that the local TCP acked but nobody read yet; 0 on error."""
    try:
        inq: int = _OUTQ.unpack(fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):  # ValueError: already closed (fileno -1)
        return 0
    return inq


def local_port_range() -> tuple[int, int]:
    """``net.ipv4.ip_local_port_range`` of this namespace (32768..60999 if unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def bind_path_port(s: socket.socket, laddr: str, index: int, avoid: int | None = None) -> int:
    """Bind a source port that names the path, ``port % 8 == index``, and return it: a tagged one
    (:func:`pyrds.userspace.proto.pathset.dial_port`, which a pyrds acceptor also pairs by index before any
    handshake), else, like 7.x ``rds_tcp_conn_path_connect``, any port of the local range with that residue
    (a 7.x or pyrds acceptor that saw SPORT_IDX pairs by ``port % npaths``; a 6.1 acceptor ignores the port
    and takes the first free path). EADDRINUSE when every such port is taken (the dial is retried later).

    Never ``avoid``, the port of the path's previous connection: only 110 tagged ports name a path, so a
    re-dial would reuse it about once in 110, and a new connection on the old 4-tuple meets whatever the
    network or the peer still holds for the old one (the peer's TCP answers its SYN with a challenge ACK
    while the old connection lives; a path black-holed by 4-tuple stays black-holed)."""
    for _ in range(32):
        port = dial_port(random.getrandbits(16), index)
        if port == avoid:
            continue
        try:
            s.bind((laddr, port))
            return port
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    low, high = local_port_range()
    for port in sport_idx_ports(index, low, high, random.getrandbits(16)):
        if port == avoid:
            continue
        try:
            s.bind((laddr, port))
            return port
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, "no free source port naming the path")
