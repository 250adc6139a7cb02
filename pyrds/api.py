"""The one socket API that both backends implement.

The methods mirror the stdlib socket object for ``socket(AF_RDS, SOCK_SEQPACKET)`` and add the RDS specifics
(info tables, TOS). Backends subclass :class:`RDSSocketBase`.
"""

from __future__ import annotations

import abc
import errno
import os
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Literal

from pyrds.addr import SockAddr

BackendName = Literal["kernel", "userspace"]
AncData = list[tuple[int, int, bytes]]


def os_error(code: int, detail: str | None = None) -> OSError:
    """``OSError`` carrying the kernel's errno and its standard message."""
    msg = os.strerror(code)
    if detail:
        msg = f"{msg} ({detail})"
    return OSError(code, msg)


class RDSSocketBase(abc.ABC):
    """An RDS socket (SOCK_SEQPACKET datagrams, reliable and ordered per peer)."""

    backend: BackendName

    # -- addressing
    @abc.abstractmethod
    def bind(self, address: SockAddr) -> None: ...

    @abc.abstractmethod
    def connect(self, address: SockAddr) -> None: ...

    @abc.abstractmethod
    def getsockname(self) -> SockAddr: ...

    @abc.abstractmethod
    def getpeername(self) -> SockAddr: ...

    # -- data
    @abc.abstractmethod
    def sendmsg(
        self,
        buffers: Iterable[bytes | bytearray | memoryview],
        ancdata: Iterable[tuple[int, int, bytes]] = (),
        flags: int = 0,
        address: SockAddr | None = None,
    ) -> int: ...

    @abc.abstractmethod
    def recvmsg(
        self, bufsize: int, ancbufsize: int = 0, flags: int = 0
    ) -> tuple[bytes, AncData, int, Any]: ...

    def send(self, data: bytes | bytearray | memoryview, flags: int = 0) -> int:
        return self.sendmsg([data], (), flags, None)

    def sendto(self, data: bytes | bytearray | memoryview, *args: Any) -> int:
        if len(args) == 1:
            flags, address = 0, args[0]
        elif len(args) == 2:
            flags, address = args
        else:
            raise TypeError(f"sendto() takes 2 or 3 arguments ({len(args) + 1} given)")
        if not isinstance(flags, int):
            raise TypeError("flags must be int")
        return self.sendmsg([data], (), flags, address)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        return self.recvmsg(bufsize, 0, flags)[0]

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, Any]:
        data, _anc, _flags, addr = self.recvmsg(bufsize, 0, flags)
        return data, addr

    # -- options
    @abc.abstractmethod
    def setsockopt(self, level: int, optname: int, value: int | bytes) -> None: ...

    @abc.abstractmethod
    def getsockopt(self, level: int, optname: int, buflen: int = 0) -> int | bytes: ...

    @abc.abstractmethod
    def get_info(self, info_type: int) -> Sequence[Any]:
        """Read one RDS_INFO table as typed records (see :mod:`pyrds.info`)."""

    @abc.abstractmethod
    def set_tos(self, tos: int) -> None: ...

    @abc.abstractmethod
    def get_tos(self) -> int: ...

    # -- file descriptor and blocking
    @abc.abstractmethod
    def fileno(self) -> int: ...

    @abc.abstractmethod
    def settimeout(self, timeout: float | None) -> None: ...

    @abc.abstractmethod
    def gettimeout(self) -> float | None: ...

    def setblocking(self, flag: bool) -> None:
        self.settimeout(None if flag else 0.0)

    def getblocking(self) -> bool:
        return self.gettimeout() != 0.0

    @abc.abstractmethod
    def close(self) -> None: ...

    # -- stdlib parity: unsupported calls fail like the kernel does
    def listen(self, backlog: int = 0) -> None:
        raise os_error(errno.EOPNOTSUPP)

    def accept(self) -> tuple[Any, Any]:
        raise os_error(errno.EOPNOTSUPP)

    def shutdown(self, how: int) -> None:
        raise os_error(errno.EOPNOTSUPP)

    def __enter__(self) -> RDSSocketBase:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
