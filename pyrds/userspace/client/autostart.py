"""Reaching this namespace's stack service from the application: connect to its abstract socket and, when
no service listens, start one (detached: new session, stdio on /dev/null or ``$PYRDS_STACK_LOG``) and wait
for it. Two processes starting at once is safe: the loser's bind fails with EADDRINUSE and it exits 0.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time

from pyrds.api import os_error
from pyrds.userspace import rpc
from pyrds.userspace.config import stack_address

__all__ = ["connect_stack", "start_timeout"]

_START_TIMEOUT = 60.0  # a loaded TCG guest can take tens of seconds to start a Python service


def start_timeout() -> float:
    """Seconds to wait for a starting stack service: $PYRDS_START_TIMEOUT, default 60."""
    raw = os.environ.get("PYRDS_START_TIMEOUT")
    try:
        value = float(raw) if raw else _START_TIMEOUT
    except ValueError:
        value = _START_TIMEOUT
    return value if value > 0 else _START_TIMEOUT


def _connect_control(addr: bytes) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(addr)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, rpc.SOCK_SNDBUF)
    except OSError:
        s.close()
        raise
    return s


def _spawn_service() -> None:
    """Start the namespace's service detached; it logs to $PYRDS_STACK_LOG (default: nowhere) so that it never
    holds the starting process's stdout/stderr pipes open."""
    log_path = os.environ.get("PYRDS_STACK_LOG")
    err = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        subprocess.Popen(
            [sys.executable, "-m", "pyrds.userspace.service"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        if not isinstance(err, int):
            err.close()


def connect_stack(autostart: bool = True) -> socket.socket:
    """A control connection to this namespace's stack, starting the service when none listens."""
    addr = stack_address()
    try:
        return _connect_control(addr)
    except (ConnectionRefusedError, FileNotFoundError):
        if not autostart:
            raise
    _spawn_service()
    deadline = time.monotonic() + start_timeout()
    delay = 0.005
    while True:
        try:
            return _connect_control(addr)
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise os_error(errno.ECONNREFUSED, "pyrds stack service did not start") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
