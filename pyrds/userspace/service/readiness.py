"""The readiness fd: a real file descriptor whose poll state mirrors an RDS socket's (service side).

The service makes a connected pair A<->B and hands A to the client as ``fileno()``; the client only polls it.
rds_poll reports POLLIN|POLLRDNORM and POLLOUT|POLLWRNORM (never POLLWRBAND for these), so A is, when the
namespace has a working loopback, a **TCP** socket over 127.0.0.1 (tcp_poll: exactly those bits); an AF_UNIX
socketpair (unix_poll adds POLLWRBAND to POLLOUT) is the fallback.

POLLIN on A: the service keeps one byte queued B->A while the socket is readable, and reads it back from A
when it is not; the client empties A itself after reading the tail of its data channel (:meth:`client_drained`
then re-arms it). POLLOUT on A, TCP: B never reads and its receive buffer is tiny, so a few KiB written into A
at setup stay queued in A for good; A's SO_SNDBUF then decides tcp_poll's writability (large: POLLOUT;
minimum: none), set while queued send bytes are >= sndbuf/2. AF_UNIX: A's tiny send buffer is filled to
remove POLLOUT and B is drained to restore it. The service only uses MSG_DONTWAIT on A so the file status
flags it shares with the client are never touched.
"""

from __future__ import annotations

import select
import socket
import struct

_NB = socket.MSG_DONTWAIT
_STUCK = 16384  # bytes parked in A (B's window is closed): tcp_poll's writability follows A's SO_SNDBUF
_BIG_SNDBUF = 1 << 20  # capped by net.core.wmem_max; far above the parked bytes
_TIMEOUT = 2.0
_U32 = 0xFFFFFFFF
#: struct tcp_info: tcpi_bytes_received (u64) at offset 128 (linux/tcp.h, since 4.1)
_TCPI_BYTES_RECEIVED = struct.Struct("=Q")
_TCPI_BYTES_RECEIVED_OFF = 128
_TCPI_LEN = 136

_tcp_broken = False
#: the fds of this service with a byte whose arrival nobody has seen yet (:meth:`Readiness.delivered`); the
#: service is one thread, and an fd leaves the set once confirmed or closed
_unconfirmed: set[Readiness] = set()


def confirm_all() -> None:
    """Before the service answers a request: every readiness byte sent so far has arrived, as the kernel's
    state is when its call returns (a receiver a local send made readable polls readable once the sender's
    send returned; a recv that re-armed its own fd finds it readable)."""
    while _unconfirmed:
        _unconfirmed.pop().delivered()


def _poll(sock: socket.socket, events: int, timeout_ms: int) -> int:
    p = select.poll()
    p.register(sock.fileno(), events)
    res = p.poll(timeout_ms)
    return res[0][1] if res else 0


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A (client side, blocking mode, writable) and B (service side, non-blocking); OSError if unusable.

    The listener is made for this one pair and closed at once: a long-lived one was a port any local user
    could flood (2026-11-23: connections queued in its backlog made every later pair time out, the service
    stalled 2 s per socket and fell back to AF_UNIX for good, whose poll mask has POLLWRBAND). Connections
    from anyone else that reach it in between are closed unread."""
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    a = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    b: socket.socket | None = None
    try:
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # accepted sockets: a tiny receive window
        lst.bind(("127.0.0.1", 0))
        lst.listen(8)
        lst.settimeout(_TIMEOUT)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BIG_SNDBUF)
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a.settimeout(_TIMEOUT)
        a.connect(lst.getsockname())
        me = a.getsockname()
        while b is None:
            conn, peer = lst.accept()
            if peer == me:
                b = conn
            else:
                conn.close()  # somebody else's connection to our listener
        b.setblocking(False)
        b.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a.settimeout(None)  # blocking file status, as the client expects; we use MSG_DONTWAIT
        left = _STUCK
        while left > 0:
            left -= a.send(b"\0" * left, _NB)
        # check tcp_poll follows SO_SNDBUF (e.g. a low net.ipv4.tcp_notsent_lowat would break it)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
        if _poll(a, select.POLLOUT, 0) & select.POLLOUT:
            raise OSError("parked bytes do not make the readiness socket unwritable")
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BIG_SNDBUF)
        if not _poll(a, select.POLLOUT, 0) & select.POLLOUT:
            raise OSError("readiness socket not writable with a large SO_SNDBUF")
    except BaseException:
        a.close()
        if b is not None:
            b.close()
        raise
    finally:
        lst.close()
    return a, b


class Readiness:
    def __init__(self) -> None:
        global _tcp_broken
        self.tcp = False
        if not _tcp_broken:
            try:
                self.a, self.b = _tcp_pair()
                self.tcp = True
            except OSError:
                _tcp_broken = True  # no loopback (or odd sysctls) in this namespace: AF_UNIX from now on
        if not self.tcp:
            self.a, self.b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # clamps to SOCK_MIN_SNDBUF
        self.readable = False
        self.writable = True
        #: a byte was sent into B whose arrival in A nobody has seen yet (:meth:`delivered` makes sure)
        self.unconfirmed = False
        #: bytes sent into B (A's tcpi_bytes_received reaches it once they all arrived), and those of them
        #: this side read back from A
        self.sent = 0
        self.taken = 0
        #: A's POLLIN, asked after every byte sent: one poll object for the socket's life (the service is
        #: single-threaded, so it is never polled twice at once)
        self._pollin = select.poll()
        self._pollin.register(self.a.fileno(), select.POLLIN)

    def _a_readable(self, timeout_ms: int) -> bool:
        return bool(self._pollin.poll(timeout_ms))

    def client_fd(self) -> int:
        return self.a.fileno()

    def set_readable(self, flag: bool) -> None:
        if flag == self.readable:
            return
        if self.unconfirmed:
            self.delivered()
        self.readable = flag
        try:
            if flag:
                self.b.send(b"r", _NB)
                self.sent += 1
                # its arrival is made sure of before anything that depends on it (:meth:`delivered`), not
                # here: by then the client's report page usually says it took the byte, and no system call
                # is needed to know (request/response: two per message, a poll and TCP_INFO, before)
                if self.tcp:
                    self.unconfirmed = True
                    _unconfirmed.add(self)
            else:
                # one read takes all that A holds (a stream read walks its whole receive queue)
                while True:
                    got = len(self.a.recv(4096, _NB))
                    self.taken += got
                    if got != 4096:
                        break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass

    def delivered(self, client_taken: int | None = None) -> None:
        """Make sure the last byte sent into B reached A before the caller goes on: before the next push
        into the data channel (a client that reads a pushed tail and finds A empty waits only for the byte of
        that very push, PUSH_BYTE_FOLLOWS), and before this side changes A again. ``client_taken``: the bytes
        the client says it ever took from A (mod 2**32, its report page); when with what this side took they
        are every byte sent, every byte arrived and no system call is needed. Else A's POLLIN, then its byte
        count, as right after the send before (loopback delivery may be deferred to ksoftirqd). A client that
        says so wrongly only confuses its own fd."""
        if not self.unconfirmed:
            return
        self.unconfirmed = False
        _unconfirmed.discard(self)
        if self._all_taken(client_taken):
            return
        try:
            if not self._a_readable(0):
                self._await_delivery()
        except OSError:
            pass

    def _all_taken(self, client_taken: int | None) -> bool:
        """``client_taken`` (the bytes the client says it ever took from A, mod 2**32) and what this side
        read back from A are every byte sent: all of them arrived, and A is empty."""
        return client_taken is not None and (client_taken + self.taken - self.sent) & _U32 == 0

    def _await_delivery(self) -> None:
        """A was not readable just after a byte was sent into B: wait (at most ~100 ms) until A's TCP has
        received every byte sent. Not POLLIN on A: the client may have read the byte already (it empties A
        after reading the tail of its data channel, and one that waits for the byte takes it as soon as it
        lands), so the test is A's byte count (tcpi_bytes_received), asked first: polling A again at once
        would only repeat what the caller's poll said."""
        for _ in range(20):
            try:
                info = self.a.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_LEN)
                received = _TCPI_BYTES_RECEIVED.unpack_from(info, _TCPI_BYTES_RECEIVED_OFF)[0]
            except (OSError, struct.error):
                received = -1  # no byte count: wait for POLLIN as before
            if received >= self.sent or self._a_readable(5):
                return

    def client_drained(self, readable: bool, client_taken: int | None = None) -> None:
        """The client emptied A itself (it read the tail of the queue from its data channel): whatever this
        side last did, make A's POLLIN say ``readable`` now. ``client_taken``: the bytes the client ever
        took from A (mod 2**32); when with what this side took they are every byte sent, A is empty and
        not readable without a read to make sure (a byte that was still on its way when the client emptied
        A, or a client that says so wrongly, gets the read)."""
        if self.unconfirmed:
            self.delivered(client_taken)
        if not readable and self._all_taken(client_taken):
            self.readable = False
            return
        self.readable = not readable
        self.set_readable(readable)

    def set_writable(self, flag: bool) -> None:
        if flag == self.writable:
            return
        self.writable = flag
        try:
            if self.tcp:
                self.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BIG_SNDBUF if flag else 1)
            elif flag:
                while self.b.recv(65536, _NB):
                    pass
            else:
                chunk = b"w" * 4096
                while True:
                    self.a.send(chunk, _NB)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass

    def close(self) -> None:
        self.unconfirmed = False
        _unconfirmed.discard(self)
        self.a.close()
        self.b.close()
