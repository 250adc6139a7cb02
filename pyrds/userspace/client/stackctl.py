"""One control request to a stack service named explicitly, never autostarting one and never talking to a
squatter: what ``pyrds stack start|stop|status`` and the test harness (stopping the stacks it started) use.
Sockets use :func:`pyrds.userspace.client.autostart.connect_stack` instead."""

from __future__ import annotations

import socket
from typing import Any

from pyrds.api import os_error
from pyrds.userspace import rpc
from pyrds.userspace.config import peer_cred, stack_address

__all__ = ["WrongServer", "stack_request"]


class WrongServer(Exception):
    """The named stack address is held by a process of another uid than the one that must serve it (a
    squatter, or another user's stack): nothing was sent to it."""

    def __init__(self, name: str, uid: int) -> None:
        super().__init__(f"pyrds stack {name!r} is served by uid {uid}")
        self.uid = uid


def stack_request(name: str, server_uid: int, op: int, args: Any = (), timeout: float = 10.0) -> Any:
    """One control operation on the stack service listening on ``name``, never autostarting one: its
    result; None when nothing listens there; :class:`WrongServer` when ``server_uid`` does not serve it
    (never talk to a squatter); OSError with the service's errno."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(timeout)
        try:
            s.connect(stack_address(name))
        except (ConnectionRefusedError, FileNotFoundError):
            return None
        uid = peer_cred(s).uid
        if uid != server_uid:
            raise WrongServer(name, uid)
        code, result, _fds = rpc.request(s, op, args)
    finally:
        s.close()
    if code:
        raise os_error(code, f"pyrds stack {name!r}")
    return result
