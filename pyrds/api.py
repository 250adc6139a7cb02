"""The one socket API that both backends implement.

The methods mirror the stdlib socket object for ``socket(AF_RDS, SOCK_SEQPACKET)`` and add the RDS specifics
(info tables, TOS). Backends subclass :class:`RDSSocketBase`.

Stdlib parity that needs nothing from a backend lives here, once: ``family``/``type``/``proto``,
``recv_into``/``recvfrom_into``, ``getblocking``, ``dup``, a stdlib-like ``repr``. With them asyncio's
``loop.sock_recv``/``sock_recv_into``/``sock_sendto``/``sock_recvfrom``/``sock_recvfrom_into`` and
``add_reader``/``add_writer`` work on both backends (see :mod:`pyrds.aio` for awaitable calls and datagram
endpoints). A backend may override any of them with a faster version (the kernel backend's own
``recv_into`` reads straight into the caller's buffer).
"""

from __future__ import annotations

import abc
import builtins
import errno
import math
import operator
import os
import socket as _socket
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, overload

from pyrds.addr import SockAddr
from pyrds.constants import AF_RDS, InfoType

if TYPE_CHECKING:
    from pyrds import info as _info

BackendName = Literal["kernel", "userspace"]
AncData = list[tuple[int, int, bytes]]
# what the stdlib accepts as data to send / a buffer to receive into (collections.abc.Buffer is 3.12+)
ReadableBuffer = bytes | bytearray | memoryview
WritableBuffer = bytearray | memoryview
# RDS socket addresses as the stdlib spells AF_INET / AF_INET6 ones
IPv4SockAddr = tuple[str, int]
IPv6SockAddr = tuple[str, int, int, int]

_COUNTERS = Literal[InfoType.RDS_INFO_COUNTERS]
_CONNS = Literal[InfoType.RDS_INFO_CONNECTIONS]
_CONNS6 = Literal[InfoType.RDS6_INFO_CONNECTIONS]
_MSGS = Literal[
    InfoType.RDS_INFO_SEND_MESSAGES, InfoType.RDS_INFO_RETRANS_MESSAGES, InfoType.RDS_INFO_RECV_MESSAGES
]
_MSGS6 = Literal[
    InfoType.RDS6_INFO_SEND_MESSAGES, InfoType.RDS6_INFO_RETRANS_MESSAGES, InfoType.RDS6_INFO_RECV_MESSAGES
]
_SOCKS = Literal[InfoType.RDS_INFO_SOCKETS]
_SOCKS6 = Literal[InfoType.RDS6_INFO_SOCKETS]
_TCP = Literal[InfoType.RDS_INFO_TCP_SOCKETS]
_TCP6 = Literal[InfoType.RDS6_INFO_TCP_SOCKETS]
_RDMA = Literal[InfoType.RDS_INFO_IB_CONNECTIONS, InfoType.RDS_INFO_IWARP_CONNECTIONS]
_RDMA6 = Literal[InfoType.RDS6_INFO_IB_CONNECTIONS]


def os_error(code: int, detail: str | None = None) -> OSError:
    """``OSError`` carrying the kernel's errno and its standard message."""
    msg = os.strerror(code)
    if detail:
        msg = f"{msg} ({detail})"
    return OSError(code, msg)


class RDSSocketBase(abc.ABC):
    """An RDS socket (SOCK_SEQPACKET datagrams, reliable and ordered per peer)."""

    backend: BackendName

    # -- what the stdlib socket object exposes as attributes
    @property
    def family(self) -> _socket.AddressFamily:
        """``AF_RDS``, as ``socket.socket(AF_RDS, SOCK_SEQPACKET).family`` (both backends)."""
        return _socket.AddressFamily(AF_RDS)

    @property
    def type(self) -> _socket.SocketKind:
        """``SOCK_SEQPACKET``: RDS is the only socket type of AF_RDS."""
        return _socket.SocketKind.SOCK_SEQPACKET

    @property
    def proto(self) -> int:
        return 0

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

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        return self.sendmsg([data], (), flags, None)

    @overload
    def sendto(self, data: ReadableBuffer, address: SockAddr, /) -> int: ...

    @overload
    def sendto(self, data: ReadableBuffer, flags: int, address: SockAddr, /) -> int: ...

    def sendto(self, data: ReadableBuffer, *args: Any) -> int:
        """``sendto(data, address)`` or ``sendto(data, flags, address)``, like the stdlib."""
        if len(args) == 1:
            return self.sendmsg([data], (), 0, args[0])  # flags 0: nothing to convert
        if len(args) != 2:
            raise TypeError(f"sendto() takes 2 or 3 arguments ({len(args) + 1} given)")
        flags, address = args
        return self.sendmsg([data], (), c_int(flags), address)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        return self.recvmsg(bufsize, 0, flags)[0]

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, SockAddr]:
        data, _anc, _flags, addr = self.recvmsg(bufsize, 0, flags)
        sender: SockAddr = addr
        return data, sender

    def recv_into(self, buffer: WritableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        """Receive one message into ``buffer`` (its first ``nbytes``, 0 = all of it); the number of bytes
        stored. A longer message is truncated to the buffer, as with the stdlib on SOCK_SEQPACKET."""
        return self._recv_into("recv_into", buffer, nbytes, flags)[0]

    def recvfrom_into(self, buffer: WritableBuffer, nbytes: int = 0, flags: int = 0) -> tuple[int, SockAddr]:
        """``recv_into`` that also returns the sender's address."""
        return self._recv_into("recvfrom_into", buffer, nbytes, flags)

    def _recv_into(self, name: str, buffer: Any, nbytes: Any, flags: int) -> tuple[int, SockAddr]:
        # the stdlib's argument checks and messages, before anything is received
        view = _writable_view(name, buffer)
        nbytes = operator.index(nbytes)
        if nbytes < 0:
            raise ValueError(f"negative buffersize in {name}")
        if nbytes == 0:
            nbytes = len(view)
        elif nbytes > len(view):
            if name == "recv_into":
                raise ValueError("buffer too small for requested bytes")
            raise ValueError("nbytes is greater than the length of the buffer")
        data, _anc, _flags, addr = self.recvmsg(nbytes, 0, flags)
        n = min(len(data), nbytes)
        view[:n] = data[:n]
        sender: SockAddr = addr
        return n, sender

    # -- options
    @abc.abstractmethod
    def setsockopt(self, level: int, optname: int, value: int | bytes) -> None: ...

    @abc.abstractmethod
    def getsockopt(self, level: int, optname: int, buflen: int = 0) -> int | bytes: ...

    @overload
    def get_info(self, info_type: _COUNTERS) -> Sequence[_info.InfoCounter]: ...
    @overload
    def get_info(self, info_type: _CONNS) -> Sequence[_info.ConnectionInfo]: ...
    @overload
    def get_info(self, info_type: _CONNS6) -> Sequence[_info.Connection6Info]: ...
    @overload
    def get_info(self, info_type: _MSGS) -> Sequence[_info.MessageInfo]: ...
    @overload
    def get_info(self, info_type: _MSGS6) -> Sequence[_info.Message6Info]: ...
    @overload
    def get_info(self, info_type: _SOCKS) -> Sequence[_info.SocketInfo]: ...
    @overload
    def get_info(self, info_type: _SOCKS6) -> Sequence[_info.Socket6Info]: ...
    @overload
    def get_info(self, info_type: _TCP) -> Sequence[_info.TcpSocketInfo]: ...
    @overload
    def get_info(self, info_type: _TCP6) -> Sequence[_info.TcpSocket6Info]: ...
    @overload
    def get_info(self, info_type: _RDMA) -> Sequence[_info.RdmaConnectionInfo]: ...
    @overload
    def get_info(self, info_type: _RDMA6) -> Sequence[_info.RdmaConnection6Info]: ...
    @overload
    def get_info(self, info_type: int) -> Sequence[Any]: ...

    @abc.abstractmethod
    def get_info(self, info_type: int) -> Sequence[Any]:
        """Read one RDS_INFO table as typed records (see :mod:`pyrds.info`); with an :class:`InfoType`
        member the records have their precise type (``get_info(InfoType.RDS_INFO_COUNTERS)`` is a sequence
        of :class:`pyrds.info.InfoCounter`)."""

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

    def dup(self) -> Self:
        """A second socket object for the same RDS socket (a duplicated fd, the same timeout), like the
        stdlib's ``dup``. Kernel backend only: a userspace socket is a control connection to its stack
        service, so it raises EOPNOTSUPP there."""
        if self.backend != "kernel":
            raise os_error(errno.EOPNOTSUPP, f"dup() of a {self.backend} socket")
        fd = self.fileno()
        if fd < 0:
            raise os_error(errno.EBADF)
        new_fd = os.dup(fd)  # close-on-exec, like the stdlib's dup
        try:
            sock = type(self)(fileno=new_fd)  # type: ignore[call-arg]
        except BaseException:
            os.close(new_fd)
            raise
        sock.settimeout(self.gettimeout())
        return sock

    def detach(self) -> int:
        """Give up the fd without closing it (the socket object is then closed). Kernel backend only; on the
        userspace backend ``fileno()`` is a readiness fd, not the RDS socket, so this raises EOPNOTSUPP."""
        raise os_error(errno.EOPNOTSUPP, f"detach() of a {self.backend} socket")

    def __repr__(self) -> str:
        """Like the stdlib's: ``<pyrds.userspace.client.RDSSocket fd=5, family=21, type=5, proto=0,
        laddr=('127.0.0.1', 4000)>`` (``[closed]`` once closed), plus the backend."""
        cls = type(self)
        fd = self.fileno()
        closed = fd < 0
        text = f"<{cls.__module__}.{cls.__qualname__} fd={fd}, family={self.family}, type={self.type}, "
        text += f"proto={self.proto}"
        if closed:
            text += ", [closed]"
        else:
            for key, get in (("laddr", self.getsockname), ("raddr", self.getpeername)):
                try:
                    addr = get()
                except Exception:  # noqa: BLE001 - repr never raises (not connected, stack gone, ...)
                    continue
                if addr:
                    text += f", {key}={addr}"
        return text + f", backend={self.backend}>"

    # -- stdlib parity: unsupported calls fail like the kernel does
    def listen(self, backlog: int = 0) -> None:
        raise os_error(errno.EOPNOTSUPP)

    def accept(self) -> tuple[Any, Any]:
        raise os_error(errno.EOPNOTSUPP)

    def shutdown(self, how: int) -> None:
        raise os_error(errno.EOPNOTSUPP)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: builtins.type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- the stdlib's argument checks, for a backend that does not go through CPython's C socket code
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_SSIZE_MAX = (1 << 63) - 1


def c_int(value: Any) -> int:
    """``value`` as CPython's ``"i"`` argument format takes it (flags): TypeError for a non-integer,
    OverflowError outside a C int, with CPython's messages."""
    v = operator.index(value)
    if v > _INT_MAX:
        raise OverflowError("signed integer is greater than maximum")
    if v < _INT_MIN:
        raise OverflowError("signed integer is less than minimum")
    return v


def c_ssize(value: Any) -> int:
    """``value`` as CPython's ``"n"`` format takes it (buffer sizes)."""
    v = operator.index(value)
    if not -_SSIZE_MAX - 1 <= v <= _SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return v


def timeout_arg(timeout: Any) -> float | None:
    """A ``settimeout`` argument as CPython's socket takes it (as the kernel backend checks it): None, or a
    non-negative number as float; TypeError for anything else (a bool too), ValueError for NaN or < 0."""
    if timeout is None:
        return None
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError("timeout must be a float or None")
    value = float(timeout)
    if math.isnan(value) or value < 0:
        raise ValueError("Timeout value out of range")
    return value


def int_arg(value: Any, what: str) -> int:
    """An int argument of an option/ioctl call, checked like the kernel backend (``TypeError: level must be
    int, not str``), then as a C int."""
    if not isinstance(value, int):
        raise TypeError(f"{what} must be int, not {type(value).__name__}")
    return c_int(value)


def readable_view(data: Any) -> memoryview:
    """A byte view of one data buffer, refused as CPython refuses it: TypeError for anything that is not
    bytes-like (``send(123)`` never sends 123 zero bytes), BufferError for a non-contiguous buffer."""
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"a bytes-like object is required, not '{type(data).__name__}'") from None
    if not view.c_contiguous:
        raise BufferError("memoryview: underlying buffer is not C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def send_buffers(buffers: Any) -> list[memoryview]:
    """``sendmsg``'s first argument: an iterable of bytes-like objects (CPython's TypeErrors)."""
    try:
        items = iter(buffers)
    except TypeError:
        raise TypeError("sendmsg() argument 1 must be an iterable") from None
    return [readable_view(b) for b in items]


def send_ancdata(ancdata: Any) -> list[tuple[int, int, bytes]]:
    """``sendmsg``'s ancillary items as (level, type, bytes), checked like the kernel backend."""
    try:
        items = list(ancdata)
    except TypeError:
        raise TypeError("sendmsg() argument 2 must be an iterable") from None
    out = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError("ancillary data items must be (level, type, data) tuples")
        level, kind, data = item
        out.append((int_arg(level, "level"), int_arg(kind, "type"), readable_view(data).tobytes()))
    return out


def _writable_view(name: str, buffer: Any) -> memoryview:
    """A writable byte view of ``buffer``, with the stdlib's TypeError for anything else."""
    message = f"{name}() argument 1 must be read-write bytes-like object, not {type(buffer).__name__}"
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(message) from None
    if view.readonly:
        raise TypeError(message)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
