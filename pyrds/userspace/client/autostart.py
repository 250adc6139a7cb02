"""Reaching this namespace's stack service from the application: connect to its abstract socket and, when
no service listens, start one (detached: new session, stdio on /dev/null or ``$PYRDS_STACK_LOG``, and a
double fork, so that the service is never a child, nor later a zombie, of the process that started it) and
wait for it. Two processes starting at once is safe: the loser's bind fails with EADDRINUSE and it exits 0.

Trust (docs/userspace.md, "Trust model"): right after connect() and before sending anything, the client reads
the service's SO_PEERCRED. The shared name is trusted only when served by uid 0; a root client refuses any
other (EACCES) and never falls back. A non-root client uses a root service of the shared name, else its own
private stack (``<name>-uid<N>``, started as itself), which it accepts only when served by its own uid.
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
from pyrds.userspace.config import peer_cred, private_stack_name, stack_address

__all__ = ["connect_stack", "spawn_service", "start_timeout"]

_START_TIMEOUT = 60.0  # a loaded TCG guest can take tens of seconds to start a Python service


def start_timeout() -> float:
    """Seconds to wait for a starting stack service: $PYRDS_START_TIMEOUT, default 60."""
    raw = os.environ.get("PYRDS_START_TIMEOUT")
    try:
        value = float(raw) if raw else _START_TIMEOUT
    except ValueError:
        value = _START_TIMEOUT
    return value if value > 0 else _START_TIMEOUT


def _connect_control(addr: bytes, server_uid: int) -> socket.socket:
    """Connect to ``addr`` and check, before a byte is sent, that the service runs as ``server_uid``
    (EACCES otherwise: the socket is closed unused)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(addr)
        cred = peer_cred(s)
        if cred.uid != server_uid:
            name = addr[1:].decode(errors="replace")
            who = f"uid {cred.uid} (pid {cred.pid})"
            detail = f"pyrds stack {name!r} served by {who}, not uid {server_uid}: refused"
            raise os_error(errno.EACCES, detail)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, rpc.SOCK_SNDBUF)
    except OSError:
        s.close()
        raise
    return s


def spawn_service(*options: str) -> None:
    """Start the namespace's service with ``options`` (``--shared`` or ``--private``, ...) detached
    (``--detach``: double fork, the intermediate child is reaped here). It logs to $PYRDS_STACK_LOG (default:
    nowhere) so that it never holds the starting process's stdout/stderr pipes open."""
    log_path = os.environ.get("PYRDS_STACK_LOG")
    err = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyrds.userspace.service", *options, "--detach"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        if not isinstance(err, int):
            err.close()
    # --detach: this child forks the service and exits as soon as it started; reap it here (a child that
    # hangs before that is left to subprocess's own reaping of abandoned children)
    try:
        proc.wait(start_timeout())
    except subprocess.TimeoutExpired:
        pass


def connect_stack(autostart: bool = True) -> socket.socket:
    """A control connection to this namespace's stack, starting the service when none listens.

    Root: the shared stack, served by uid 0, or EACCES. Others: the shared stack when root serves it, else
    their private stack (served by their own uid, or EACCES)."""
    euid = os.geteuid()
    addr = stack_address()
    try:
        return _connect_control(addr, 0)
    except (ConnectionRefusedError, FileNotFoundError):
        if euid == 0 and not autostart:
            raise
    except PermissionError:
        if euid == 0:
            raise  # someone else holds the shared name: never talk to it, never serve around it
    if euid != 0:  # no root service: this uid's own stack
        addr = stack_address(private_stack_name(euid))
        try:
            return _connect_control(addr, euid)
        except (ConnectionRefusedError, FileNotFoundError):
            if not autostart:
                raise
    deadline = time.monotonic() + start_timeout()
    # the shared stack when we are root, else this uid's private stack (it serves nobody else)
    spawn_service("--shared" if euid == 0 else "--private")
    delay = 0.005
    while True:
        try:
            return _connect_control(addr, euid)
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise os_error(errno.ECONNREFUSED, "pyrds stack service did not start") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
