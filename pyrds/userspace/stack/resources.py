"""Bounded resources of the service (docs/userspace.md, "Bounded resources"): the receive-queue cap, the
spare file descriptor that lets a listener shed a connection at EMFILE instead of spinning, and giving freed
memory back to the system.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Callable

__all__ = [
    "FD_EXHAUSTED",
    "RECV_CAP_MIN",
    "RECV_CAP_RCVBUF_FACTOR",
    "RECV_MSG_OVERHEAD",
    "SpareFd",
    "recv_cap",
    "release_memory",
]


#: a socket's receive queue is never held above this many charged bytes ...
RECV_CAP_MIN = 8 << 20
#: ... or this many times its SO_RCVBUF, whichever is larger (the kernel congests at rcvbuf / 2)
RECV_CAP_RCVBUF_FACTOR = 16
#: what a queued message costs beyond its payload (the Incoming object, its deque slot, the bytes header):
#: charged so that a flood of empty messages, which never congests a port in the kernel (rds_recv_rcvbuf_delta
#: counts payload bytes only), is capped too
RECV_MSG_OVERHEAD = 256

#: accept() errnos that mean "no descriptor or memory for a new socket", not a broken listener
FD_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def recv_cap(rcvbuf: int) -> int:
    """Charged bytes (payload + :data:`RECV_MSG_OVERHEAD` per message) a socket of SO_RCVBUF ``rcvbuf``
    queues before the transport stops reading the connection that feeds it."""
    return max(RECV_CAP_MIN, RECV_CAP_RCVBUF_FACTOR * rcvbuf)


class SpareFd:
    """One descriptor kept open so that, at EMFILE, a listener can still accept a connection (closing the
    spare first) and refuse it at once, instead of leaving it in the backlog: a listener that stays readable
    while accept() fails turns the event loop into a spin, and the client behind it waits forever."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.reopen()

    def reopen(self) -> None:
        if self.fd is None:
            try:
                self.fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.fd = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def shed(self, listener: socket.socket, refuse: Callable[[socket.socket], None]) -> bool:
        """At EMFILE: free the spare, accept one connection, ``refuse`` it (best effort) and close it, take
        the spare back. False when not even that accepted one (the caller backs off)."""
        self.release()
        try:
            sock, _ = listener.accept()
        except OSError:
            self.reopen()
            return False
        try:
            refuse(sock)
        except OSError:
            pass
        finally:
            sock.close()
            self.reopen()
        return True


_libc: ctypes.CDLL | None = None
_libc_loaded = False


def release_memory() -> None:
    """Give freed heap pages back to the system (glibc ``malloc_trim(0)``): a large receive queue is freed
    when its socket closes, but glibc keeps the pages of a fragmented heap unless asked."""
    global _libc, _libc_loaded
    if not _libc_loaded:
        _libc_loaded = True
        try:
            lib: ctypes.CDLL | None = ctypes.CDLL(None)  # the process's own symbols: libc's among them
        except OSError:
            lib = None
        _libc = lib if lib is not None and hasattr(lib, "malloc_trim") else None
    if _libc is not None:
        _libc.malloc_trim(0)
