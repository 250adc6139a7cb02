"""The daemon process: ``python -m pyrds.userspace.service`` runs :func:`main` (logging, the listener,
RDS/TCP, the loop until idle). A second service in the same namespace loses the bind race with EADDRINUSE
and exits 0.
"""

from __future__ import annotations

import errno
import logging
import os
import sys

from pyrds.userspace.service.server import Service

__all__ = ["main"]

log = logging.getLogger("pyrds.userspace.service")


def _tune_malloc() -> None:
    """Keep large receive buffers off mmap: every ``recv(256 KiB)`` of the TCP path allocates the bytes object
    above glibc's 128 KiB mmap threshold and shrinks it, which costs mmap + mremap + munmap and fresh page
    faults per read (a freed shrunk chunk never raises the dynamic threshold). glibc only; best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(8 << 20))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    _tune_malloc()
    logging.basicConfig(
        level=os.environ.get("PYRDS_LOG", "WARNING"),
        stream=sys.stderr,
        format="pyrds-stack[%(process)d] %(levelname)s %(message)s",
    )
    svc = Service()
    try:
        svc.bind()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return 0  # another service won the race: clients use it
        raise
    try:
        svc.start_tcp()
    except (OSError, ImportError) as exc:
        log.warning("RDS/TCP listener unavailable (%s): loop transport only", exc)
    svc.serve_forever()
    return 0
