"""The service's operations other than the data path, as a table: :data:`HANDLERS` maps each
:class:`rpc.Op` to the function that serves it (the binary SEND/RECV records are served in
:mod:`pyrds.userspace.service.server`).

A handler gets the :class:`Request` and the operation's arguments and returns the result; it fails by raising
(:class:`~pyrds.userspace.stack.errors.StackError` for an errno). Every operation but those in
:data:`WITHOUT_SOCKET` needs the connection's RDS socket (EBADF before OPEN); an unknown operation is EINVAL.
Stack-wide writes (SYSCTL_SET, which ``control.force_reconnect`` uses too), STOP (``pyrds stack stop``) and
NO_IDLE_EXIT (``pyrds stack start`` finding an autostarted stack) need privilege
(:func:`~pyrds.userspace.service.trust.may_administer`): EACCES otherwise, as for an unprivileged write to
/proc/sys/net/rds. STATUS (``pyrds stack status``) is a read, open to every client.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrds.addr import IPAddress
from pyrds.constants import SO_RCVBUFFORCE, SO_SNDBUFFORCE
from pyrds.userspace import rpc
from pyrds.userspace.config import SYSCTL_NON_NEGATIVE, PeerCred
from pyrds.userspace.service.datachannel import DataChannel
from pyrds.userspace.service.readiness import Readiness
from pyrds.userspace.service.sendwaker import SendWaker
from pyrds.userspace.service.trust import has_cap_net_admin, may_administer
from pyrds.userspace.stack import info_tables, sockopts
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.memory import ClientMemory, own_memory
from pyrds.userspace.stack.sockstate import SockState

__all__ = ["HANDLERS", "WITHOUT_SOCKET", "Request", "dispatch"]


@dataclass
class Request:
    """One control request: the stack, the connection's socket (None before OPEN; OPEN sets it and the
    server keeps it for the connection), the fds to pass back with the reply (SCM_RIGHTS) and the client's
    SO_PEERCRED (None: an in-process caller)."""

    stack: Stack
    rs: SockState | None
    fds: list[int] = field(default_factory=list)
    peer: PeerCred | None = None
    #: asks the serving loop to exit (STOP); None: nothing to stop (an embedded stack without a loop)
    stop: Callable[[], None] | None = None
    #: the service's own figures for STATUS (client connections, start time), from the server
    service_status: Callable[[], dict[str, Any]] | None = None
    #: called once the reply (and its fds) went out: the service closes its copies of handed-over fds
    after_reply: list[Callable[[], None]] = field(default_factory=list)

    @property
    def sock(self) -> SockState:
        if self.rs is None:
            raise StackError(errno.EBADF)
        return self.rs


Handler = Callable[[Request, Any], Any]


def _ip(s: str) -> IPAddress:
    return ipaddress.ip_address(s)


def _open(req: Request, _args: Any) -> int:
    """A new RDS socket: its readiness fd and its data channel (service/datachannel.py) go to the client."""
    if req.rs is None:
        rs = req.rs = req.stack.open()
        # RDMA names the client's memory: the pid of this connection's peer, nothing else (stack/memory.py)
        rs.memory = ClientMemory(req.peer.pid, req.peer.uid) if req.peer is not None else own_memory()
        ready = rs.readiness = Readiness()
        channel = rs.push = DataChannel()
        req.fds.extend((ready.client_fd(), *channel.client_fds()))
        req.after_reply.append(channel.handed_over)
    return req.rs.sock_id


def _send_waker(req: Request, _args: Any) -> int:
    """The read end of the socket's send waker (service/sendwaker.py), made on the first request; a new pipe
    each time it is asked for again (the client lost its end), the old one closed."""
    rs = req.sock
    if rs.send_waker is not None:
        rs.send_waker.close()
    waker = SendWaker()
    rs.send_waker = waker
    req.fds.append(waker.client_fd())
    req.after_reply.append(waker.handed_over)
    return 0


def _sysctl_get(req: Request, _args: Any) -> dict[str, int]:
    return dict(req.stack.config.sysctl)


def _sysctl_set(req: Request, args: Any) -> None:
    name, value = args
    config = req.stack.config
    if name not in config.sysctl:
        raise StackError(errno.ENOENT)
    if not may_administer(req.peer, config.owner):
        raise StackError(errno.EACCES)
    if name in SYSCTL_NON_NEGATIVE and not 0 <= int(value) < 1 << 31:
        raise StackError(errno.EINVAL)
    config.set_sysctl(name, value)
    if name in ("rds_tcp_sndbuf", "rds_tcp_rcvbuf"):
        for transport in req.stack.transports:
            transport.reset()


def _status(req: Request, _args: Any) -> dict[str, Any]:
    """What ``pyrds stack status`` shows: who serves, since when, how idle exit is set, and counts."""
    stack = req.stack
    config = stack.config
    tcp = sum(1 for transport in stack.transports for _ in transport.info_tcp_sockets())
    status: dict[str, Any] = {
        "pid": os.getpid(),
        "uid": os.geteuid(),
        "owner": config.owner,
        "name": config.served_name,
        "idle_exit": config.idle_exit,
        "tcp_port": config.tcp_port,
        "rds_sockets": len(stack.socks),
        "tcp_connections": tcp,
        "now": time.time(),
    }
    if req.service_status is not None:
        status.update(req.service_status())
    return status


def _stop(req: Request, _args: Any) -> None:
    if not may_administer(req.peer, req.stack.config.owner):
        raise StackError(errno.EACCES)
    if req.stop is None:
        raise StackError(errno.EOPNOTSUPP)
    req.stop()


def _no_idle_exit(req: Request, _args: Any) -> None:
    """Keep serving until stopped: ``pyrds stack start`` on a stack a client started (``--no-idle-exit``)."""
    if not may_administer(req.peer, req.stack.config.owner):
        raise StackError(errno.EACCES)
    req.stack.config.idle_exit = -1


def _send(req: Request, args: Any) -> int:
    """The generic send. ``payload`` may be an int: the size of a message over RDS_MAX_MSG_SIZE that the
    client did not ship (it could not cross the control connection); it gets the kernel's error for it."""
    payload, anc, flags, dest, nonblock = args
    d = (_ip(dest[0]), dest[1]) if dest is not None else None
    if type(payload) is int:
        req.stack.refuse_oversize(req.sock, payload, anc, flags, d)
    if not isinstance(payload, bytes):
        raise StackError(errno.EINVAL)
    return req.stack.sendmsg(req.sock, payload, anc, flags, d, nonblock)


def _recv(req: Request, args: Any) -> Any:
    bufsize, ancbufsize, flags, nonblock = args
    return req.stack.recvmsg(req.sock, bufsize, ancbufsize, flags, nonblock)


def _bind(req: Request, args: Any) -> int:
    host, port, scope = args
    rs = req.sock
    req.stack.bind(rs, _ip(host), port, scope)
    return rs.bound_port


def _connect(req: Request, args: Any) -> None:
    host, port, v6 = args
    req.stack.connect(req.sock, _ip(host), port, v6)


def _getsockname(req: Request, _args: Any) -> tuple[str | None, int, int, str | None]:
    rs = req.sock
    return (
        str(rs.bound_addr) if rs.bound_addr else None,
        rs.bound_port,
        rs.scope_id,
        str(rs.conn_addr) if rs.conn_addr else None,
    )


def _getpeername(req: Request, _args: Any) -> tuple[str, int, int]:
    rs = req.sock
    if rs.conn_addr is None:
        raise StackError(errno.ENOTCONN)
    return (str(rs.conn_addr), rs.conn_port, rs.scope_id)


def _setsockopt(req: Request, args: Any) -> None:
    level, name, value = args
    net_admin = True  # only the FORCE options ask, and then CAP_NET_ADMIN itself, as the kernel does
    if level == socket.SOL_SOCKET and name in (SO_SNDBUFFORCE, SO_RCVBUFFORCE) and req.peer is not None:
        net_admin = has_cap_net_admin(req.peer)
    sockopts.setsockopt(req.stack, req.sock, level, name, value, net_admin)


def _getsockopt(req: Request, args: Any) -> Any:
    level, name, buflen = args
    return sockopts.getsockopt(req.stack, req.sock, level, name, buflen)


def _info(req: Request, args: Any) -> bytes:
    (info_type,) = args
    raw, _each = info_tables.table_bytes(req.stack, info_type, 1 << 30)
    return raw


def _set_tos(req: Request, args: Any) -> None:
    sockopts.set_tos(req.sock, args[0])


def _get_tos(req: Request, _args: Any) -> int:
    return req.sock.tos


HANDLERS: dict[rpc.Op, Handler] = {
    rpc.Op.OPEN: _open,
    rpc.Op.SYSCTL_GET: _sysctl_get,
    rpc.Op.SYSCTL_SET: _sysctl_set,
    rpc.Op.SEND: _send,
    rpc.Op.RECV: _recv,
    rpc.Op.BIND: _bind,
    rpc.Op.CONNECT: _connect,
    rpc.Op.GETSOCKNAME: _getsockname,
    rpc.Op.GETPEERNAME: _getpeername,
    rpc.Op.SETSOCKOPT: _setsockopt,
    rpc.Op.GETSOCKOPT: _getsockopt,
    rpc.Op.INFO: _info,
    rpc.Op.SET_TOS: _set_tos,
    rpc.Op.GET_TOS: _get_tos,
    rpc.Op.STATUS: _status,
    rpc.Op.STOP: _stop,
    rpc.Op.NO_IDLE_EXIT: _no_idle_exit,
    rpc.Op.SEND_WAKER: _send_waker,
}
#: operations served without an RDS socket (before OPEN, or stack-wide)
WITHOUT_SOCKET = frozenset(
    {rpc.Op.OPEN, rpc.Op.SYSCTL_GET, rpc.Op.SYSCTL_SET, rpc.Op.STATUS, rpc.Op.STOP, rpc.Op.NO_IDLE_EXIT}
)


def dispatch(req: Request, op: Any, args: Any) -> Any:
    """Serve one operation: EBADF when it needs a socket and there is none, EINVAL when it is unknown."""
    try:
        handler = HANDLERS.get(op)
        needs_socket = op not in WITHOUT_SOCKET
    except TypeError:  # an unhashable op from a confused client
        handler, needs_socket = None, True
    if needs_socket and req.rs is None:
        raise StackError(errno.EBADF)
    if handler is None:
        raise StackError(errno.EINVAL)
    return handler(req, args)
