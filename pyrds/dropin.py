"""Run an unmodified Python program's AF_RDS sockets on the userspace stack.

    python -m pyrds.dropin [--backend auto|userspace] program.py [args...]
    python -m pyrds.dropin [--backend auto|userspace] -m module [args...]

The program runs in this process (``runpy``, as ``python program.py`` would: ``__main__``, ``sys.argv``,
``sys.path[0]``). When the kernel has no AF_RDS (``--backend auto``, the default) or always
(``--backend userspace``), ``socket.socket(AF_RDS, SOCK_SEQPACKET[, 0])`` returns a ``pyrds`` userspace
socket: the same calls (bind, sendto, recvfrom, recvmsg, setsockopt/getsockopt incl. SOL_RDS and RDS_INFO,
setblocking, settimeout, poll/select/epoll on ``fileno()``) with the kernel's results and errno. Every other
socket is the stdlib's, and ``isinstance(s, socket.socket)`` stays true for both kinds. Only this process is
patched: child processes (``subprocess``) run unpatched.

What cannot follow: a userspace socket is a connection from the creating process to its namespace's stack
service, and ``fileno()`` is a readiness fd, not the socket. So ``socket.fromfd``/``socket.socket(fileno=)``
on such an fd, passing it to another process (``send_fds``), ``dup``/``detach`` and ``os.fork`` followed by
use in both processes raise or do not carry the socket; ``fromfd`` with AF_RDS raises EOPNOTSUPP naming
this. Kernel sysctls (``/proc/sys/net/rds``) do not exist without the kernel module; the userspace stack's
settings are ``pyrds.socket("userspace").sysctl_set``.
"""

from __future__ import annotations

import argparse
import errno
import os
import runpy
import socket as _socket
import sys
from collections.abc import Sequence
from typing import Any

from pyrds.api import RDSSocketBase, os_error
from pyrds.constants import AF_RDS

__all__ = ["install", "installed", "main", "uninstall"]

_ORIGINAL_SOCKET = _socket.socket
_ORIGINAL_FROMFD = _socket.fromfd
_FLAGS = _socket.SOCK_NONBLOCK | _socket.SOCK_CLOEXEC


def _is_rds(family: Any) -> bool:
    return isinstance(family, int) and not isinstance(family, bool) and int(family) == AF_RDS


def _rds_socket(type: int, proto: int) -> RDSSocketBase:
    """A userspace RDS socket for ``socket(AF_RDS, type, proto)``, with the kernel's checks."""
    if type == -1:
        type = _socket.SOCK_SEQPACKET
    if proto == -1:
        proto = 0
    base = type & ~_FLAGS
    if base != _socket.SOCK_SEQPACKET or proto != 0:
        raise os_error(errno.ESOCKTNOSUPPORT)  # rds_create
    from pyrds.userspace import RDSSocket

    sock = RDSSocket()
    if type & _socket.SOCK_NONBLOCK:
        sock.setblocking(False)
    return sock


class _SocketMeta(type):
    """``isinstance(x, socket.socket)`` is true for stdlib sockets (made before or after the patch) and for
    the userspace RDS sockets this module hands out."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (_ORIGINAL_SOCKET, RDSSocketBase))

    def __subclasscheck__(cls, sub: Any) -> bool:
        return isinstance(sub, type) and issubclass(sub, (_ORIGINAL_SOCKET, RDSSocketBase))


class socket(_ORIGINAL_SOCKET, metaclass=_SocketMeta):  # noqa: N801 - it replaces socket.socket
    """``socket.socket`` with AF_RDS served by the pyrds userspace stack."""

    __slots__ = ()

    def __new__(cls, family: Any = -1, type: Any = -1, proto: Any = -1, fileno: Any = None) -> Any:  # noqa: A002 - the stdlib's parameter names
        if fileno is None and _is_rds(family):
            return _rds_socket(int(type), int(proto))
        if fileno is not None and _is_rds(family):
            raise os_error(
                errno.EOPNOTSUPP,
                "pyrds.dropin: a userspace RDS socket cannot be rebuilt from a file descriptor",
            )
        return _ORIGINAL_SOCKET.__new__(cls)


def _fromfd(fd: Any, family: Any, type: Any, proto: int = 0) -> Any:  # noqa: A002
    if _is_rds(family):
        raise os_error(
            errno.EOPNOTSUPP,
            "pyrds.dropin: socket.fromfd() cannot rebuild a userspace RDS socket (fileno() is only its "
            "readiness fd; the socket belongs to the process that created it)",
        )
    return _ORIGINAL_FROMFD(fd, family, type, proto)


def installed() -> bool:
    return _socket.socket is socket


def install() -> None:
    """Patch ``socket.socket`` and ``socket.fromfd`` of this process for AF_RDS (idempotent)."""
    _socket.socket = socket  # type: ignore[misc]
    _socket.fromfd = _fromfd


def uninstall() -> None:
    _socket.socket = _ORIGINAL_SOCKET  # type: ignore[misc]
    _socket.fromfd = _ORIGINAL_FROMFD


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pyrds.dropin",
        description="run a Python program whose socket(AF_RDS, SOCK_SEQPACKET) sockets use the pyrds "
        "userspace stack (when the kernel has no AF_RDS, or always with --backend userspace)",
    )
    parser.add_argument("--backend", choices=("auto", "userspace"), default="auto")
    parser.add_argument("-m", dest="module", default=None, help="run a module, like python -m")
    parser.add_argument("program", nargs="?", help="the program's path (unless -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    ns = parser.parse_args(argv)
    if ns.module is None and ns.program is None:
        parser.error("give a program or -m module")
    import pyrds

    if ns.backend == "userspace" or not pyrds.kernel_available():
        install()
    if ns.module is not None:
        args = [ns.program, *ns.args] if ns.program is not None else list(ns.args)
        sys.argv = [ns.module, *args]
        runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
        return 0
    path = os.path.abspath(ns.program)
    if not os.path.exists(path):
        parser.error(f"can't open file {ns.program!r}: [Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}")
    sys.argv = [ns.program, *ns.args]
    sys.path[0] = os.path.dirname(path)
    runpy.run_path(path, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
