"""Bounded resources of the service (docs/userspace.md, "Bounded resources"): the receive-queue cap and
giving freed memory back to the system.
"""

from __future__ import annotations

import ctypes

__all__ = [
    "RECV_CAP_MIN",
    "RECV_CAP_RCVBUF_FACTOR",
    "RECV_MSG_OVERHEAD",
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


def recv_cap(rcvbuf: int) -> int:
    """Charged bytes (payload + :data:`RECV_MSG_OVERHEAD` per message) a socket of SO_RCVBUF ``rcvbuf``
    queues before the transport stops reading the connection that feeds it."""
    return max(RECV_CAP_MIN, RECV_CAP_RCVBUF_FACTOR * rcvbuf)


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
