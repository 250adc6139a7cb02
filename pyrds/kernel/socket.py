"""The native backend: an AF_RDS socket of the running kernel, driven through the stdlib's C socket code.

Every data call (``send``, ``sendto``, ``sendmsg``, ``recv``, ``recvfrom``, ``recvmsg``, ``recv_into``,
``recvfrom_into``) runs in CPython's ``_socket`` module on two *views* of the one AF_RDS fd: an AF_INET view
(CPython builds a ``sockaddr_in`` from ``(host, port)``) and an AF_INET6 view (a ``sockaddr_in6`` from a
4-tuple, and a name buffer large enough that a received IPv6 source comes back as ``(host, port, flowinfo,
scope_id)``; CPython decodes a name by its ``sa_family``, so IPv4 sources stay 2-tuples). The views never
close the fd: one :class:`_Fd` held by the socket and both views does, once, at ``close()`` (both views
detached first) or when neither the socket nor a data call taken from it is left. ``send`` and ``recvmsg``
*are* the C methods (bound per socket); the others add one check around them (the address route of
``sendto``/``sendmsg``, cached per destination; ``MSG_TRUNC``, where CPython's ``recv``/``recvfrom`` would
return a buffer grown to the full message length and ``recv_into`` the full length). That check is a Python
closure per call; when the optional C module ``pyrds.kernel._fastcall`` is built (setup.py), a ``FastCall``
object calls the view's C method itself for the shapes where the closure would only forward (no MSG_TRUNC,
the last destination again, also as an equal tuple when its host is a literal IP) and the closure for every
other, so a data call costs no Python frame. ctypes remains for what the stdlib cannot do: getsockopt buffers
over 1024 bytes and the RDS_INFO tables (pyrds/kernel/libc.py).

Timeouts are CPython's own (both views carry the same timeout): ``settimeout(None)`` leaves the fd blocking;
``settimeout(0)`` makes it non-blocking (EAGAIN raises ``BlockingIOError``); ``settimeout(t > 0)`` makes the
fd non-blocking and each call polls until the deadline, then raises ``TimeoutError("timed out")`` (errno
None). Kernel errors (ENOBUFS for a congested peer, ENOTCONN, ...) pass through as ``OSError(errno,
strerror)``. The userspace backend must behave the same way.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import operator
import os
import socket as _socket
import struct
from _socket import socket as _CSocket  # the C type whose method descriptors the views inherit
from collections.abc import Iterable, Sequence
from typing import Any

from pyrds import info as _info
from pyrds.addr import SockAddr, parse_address
from pyrds.api import (
    AncData,
    BackendName,
    RDSSocketBase,
    ReadableBuffer,
    WritableBuffer,
    os_error,
    timeout_arg,
)
from pyrds.constants import AF_RDS, SIOCRDSGETTOS, SIOCRDSSETTOS, SOL_RDS
from pyrds.kernel import libc

_MAX_INFO_ATTEMPTS = 16
_MSG_TRUNC = int(_socket.MSG_TRUNC)
# flags as the stdlib's C methods took them (an int, or any object with __index__): tested after the call,
# when a message may already be consumed, so never with an operator the object could lack or redefine
_index = operator.index
_STDLIB_OPTLEN_MAX = 1024  # CPython's getsockopt refuses larger buffers
_NOARG: Any = object()
# The C data calls (None: not built). Tests and benchmarks set it to None to run the pure-Python calls; it is
# read when a socket is made.
FASTCALL: Any
try:
    import pyrds.kernel._fastcall as FASTCALL
except ImportError:  # built without a C compiler: the pure-Python data calls (same behaviour)
    FASTCALL = None


class _Fd:
    """The fd of an :class:`RDSSocket`, closed once: by ``close()``, or when the last object that can use it
    is gone. The socket and both views hold it, and every data call holds a view, so a data call taken from
    a socket keeps the fd open after the socket object is gone (``recv = s.recv; del s``), as the stdlib's
    bound method keeps its socket."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def detach(self) -> int:
        """Give the fd up unclosed (-1: it was closed or given up already)."""
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        fd = self.detach()
        if fd >= 0:
            try:
                os.close(fd)
            except InterruptedError:
                pass  # never retry close on EINTR: the fd is gone on Linux

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


class _View(_socket.socket):
    """A stdlib socket object on an fd it does not own: finalizing it never closes the fd (its :class:`_Fd`,
    held in ``owner``, closes it once; :class:`RDSSocket` detaches both views before closing)."""

    __slots__ = ("owner",)
    owner: _Fd

    def __del__(self) -> None:
        self.detach()


# Validated destinations: the user's address (exact str/int types, a literal IP host) -> (IPv6?, the numeric
# tuple CPython parses into the same sockaddr bytes as parse_address + make_sockaddr_in[6] did). Names that
# need resolving are never cached (their address may change). Bounded: cleared when full.
_ROUTES: dict[tuple[Any, ...], tuple[bool, SockAddr]] = {}
_ROUTES_MAX = 4096


def _exact(address: Any) -> bool:
    """``address`` is a tuple of exactly str, int[, int, int]: equal tuples then mean equal addresses (a bool
    port compares equal to 0/1 but parse_address refuses it)."""
    if type(address) is not tuple:
        return False
    n = len(address)
    if n == 2:
        return type(address[0]) is str and type(address[1]) is int
    if n == 4:
        return (
            type(address[0]) is str
            and type(address[1]) is int
            and type(address[2]) is int
            and type(address[3]) is int
        )
    return False


def _literal(address: Any, numeric: SockAddr) -> bool:
    """The host of ``address`` (one :func:`route` accepted) is ``numeric``'s own text: a literal, canonical
    IP, so no name was resolved and an equal address always has the same route."""
    host = address[0]
    return bool(host) and host == numeric[0]


def route(address: Any) -> tuple[bool, SockAddr]:
    """``(is IPv6, numeric address)`` for a user-supplied RDS address; TypeError/ValueError/OverflowError
    exactly as :func:`pyrds.addr.parse_address`. The numeric address gives CPython's AF_INET/AF_INET6
    parsing the very ``sockaddr_in``/``sockaddr_in6`` the ctypes path built (IPv6 hosts go through
    ``inet_pton`` as before, so a ``%scope`` host still fails the same way)."""
    exact = _exact(address)
    if exact:
        hit = _ROUTES.get(address)
        if hit is not None:
            return hit
    a = parse_address(address)
    if a.ip.version == 6:
        host = _socket.inet_ntop(_socket.AF_INET6, _socket.inet_pton(_socket.AF_INET6, str(a.ip)))
        result: tuple[bool, SockAddr] = (True, (host, a.port, a.flowinfo, a.scope_id))
    else:
        result = (False, (str(a.ip), a.port))
    if exact and _literal(address, result[1]):
        if len(_ROUTES) >= _ROUTES_MAX:
            _ROUTES.clear()
        _ROUTES[address] = result
    return result


def _check_int(value: Any, what: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be int, not {type(value).__name__}")
    return int(value)


def _check_ancdata(ancdata: Iterable[Any]) -> list[tuple[int, int, Any]]:
    items = list(ancdata)
    for item in items:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError("ancillary data items must be (level, type, data) tuples")
        _check_int(item[0], "level")
        _check_int(item[1], "type")
    return items


def _data_calls(v4: _View, v6: _View, fast: Any = None) -> dict[str, Any]:
    """The data calls of one socket as closures over its two views' C methods (no ``self``: the closures live
    in the instance's ``__dict__`` and must not make a reference cycle through it). Each adds to the stdlib
    call only what keeps pyrds's behaviour: the address route (cached for the last destination object), and
    the ``MSG_TRUNC`` clamp. With ``fast`` (the ``pyrds.kernel._fastcall`` module) each closure is wrapped in
    a ``FastCall`` that skips it for the shapes where it would only forward the call."""
    send4, send6 = v4.sendto, v6.sendto
    sendmsg4, sendmsg6 = v4.sendmsg, v6.sendmsg
    recv6, recvfrom6 = v6.recv, v6.recvfrom
    recv_into6, recvfrom_into6 = v6.recv_into, v6.recvfrom_into
    # last[0]: (the last destination object, its view's sendto, its view's sendmsg, the numeric tuple CPython
    # parses into the same sockaddr bytes): one tuple, replaced whole, so that a thread never pairs one
    # destination's object with another's route; the object is a tuple of exact str/int types, hence
    # immutable. A list of one item so that the C FastCall objects read the same route.
    noarg = _NOARG  # (a closure cell is read faster than a global)
    zero = 0
    # (for the C calls, the view itself, and whether the host is a literal IP: then an equal tuple of exact
    # str/int types is the same destination, as in route's cache; a name is resolved again for a new object)
    last: list[tuple[Any, Any, Any, Any, Any, bool]] = [(_NOARG, send4, sendmsg4, None, v4, False)]

    def _learn(address: Any) -> tuple[Any, Any, Any, Any, Any, bool]:
        v6_dest, addr = route(address)
        literal = _literal(address, addr)
        if v6_dest:
            entry = (address, send6, sendmsg6, addr, v6, literal)
        else:
            entry = (address, send4, sendmsg4, addr, v4, literal)
        if _exact(address):
            last[0] = entry
        return entry

    def sendto(data: Any, flags_or_address: Any, address: Any = noarg, /) -> int:
        if address is noarg:  # sendto(data, address)
            entry = last[0]
            if flags_or_address is not entry[0]:
                entry = _learn(flags_or_address)
            return entry[1](data, entry[3])  # type: ignore[no-any-return]
        entry = last[0]
        if address is not entry[0]:
            entry = _learn(address)
        return entry[1](data, flags_or_address, entry[3])  # type: ignore[no-any-return]

    def sendmsg(buffers: Any, ancdata: Any = (), flags: Any = 0, address: Any = None) -> int:
        if ancdata:
            ancdata = _check_ancdata(ancdata)
        if address is None:
            return sendmsg6(buffers, ancdata, flags)
        entry = last[0]
        if address is not entry[0]:
            entry = _learn(address)
        return entry[2](buffers, ancdata, flags, entry[3])  # type: ignore[no-any-return]

    def recv(bufsize: Any, flags: Any = 0) -> bytes:
        if flags is zero:
            return recv6(bufsize)
        data: bytes = recv6(bufsize, flags)
        if _index(flags) & _MSG_TRUNC:
            # with MSG_TRUNC the kernel returns the message's full length and CPython grows the bytes to it:
            # only the first bufsize bytes were received
            return data[:bufsize]
        return data

    def recvfrom(bufsize: Any, flags: Any = 0) -> tuple[bytes, SockAddr]:
        if flags is zero:  # the int 0 (a cached object); 0.0, None, "" go on to the stdlib's TypeError
            return recvfrom6(bufsize)
        if _index(flags) & _MSG_TRUNC:
            data, addr = recvfrom6(bufsize, flags)
            return data[:bufsize], addr
        return recvfrom6(bufsize, flags)

    def recv_into(buffer: Any, nbytes: Any = 0, flags: Any = 0) -> int:
        n: int = recv_into6(buffer, nbytes, flags)
        if _index(flags) & _MSG_TRUNC:
            # the kernel's answer is the full length; pyrds reports the bytes stored (like recv/recvmsg)
            return min(n, nbytes or memoryview(buffer).nbytes)
        return n

    def recvfrom_into(buffer: Any, nbytes: Any = 0, flags: Any = 0) -> tuple[int, SockAddr]:
        if _index(flags) & _MSG_TRUNC:
            n, addr = recvfrom_into6(buffer, nbytes, flags)
            return min(n, nbytes or memoryview(buffer).nbytes), addr
        return recvfrom_into6(buffer, nbytes, flags)

    calls: dict[str, Any] = {
        "send": v4.send,  # the C method itself: the stdlib's send is exactly pyrds's
        "sendto": sendto,
        "sendmsg": sendmsg,
        "recv": recv,
        "recvfrom": recvfrom,
        "recvmsg": v6.recvmsg,  # likewise (CPython's recvmsg never returns more than bufsize bytes)
        "recv_into": recv_into,
        "recvfrom_into": recvfrom_into,
    }
    if fast is not None:
        make, std = fast.FastCall, _CSocket  # the C method descriptors, called with a view as self
        calls["sendto"] = make(fast.SENDTO, "sendto", sendto, std.sendto, None, last)
        calls["sendmsg"] = make(fast.SENDMSG, "sendmsg", sendmsg, std.sendmsg, v6, last)
        calls["recv"] = make(fast.RECV, "recv", recv, std.recv, v6)
        calls["recvfrom"] = make(fast.RECV, "recvfrom", recvfrom, std.recvfrom, v6)
        calls["recv_into"] = make(fast.RECV_INTO, "recv_into", recv_into, std.recv_into, v6)
        calls["recvfrom_into"] = make(fast.RECV_INTO, "recvfrom_into", recvfrom_into, std.recvfrom_into, v6)
    return calls


class RDSSocket(RDSSocketBase):
    """An AF_RDS/SOCK_SEQPACKET socket of the running kernel."""

    backend: BackendName = "kernel"

    def __init__(self, fileno: int | None = None) -> None:
        self._owner = _Fd(-1)  # the fd once it is ours; -1 until then and after close() or detach()
        self._timeout: float | None = None
        created = fileno is None
        if fileno is None:
            # the stdlib creates it close-on-exec, like SOCK_CLOEXEC
            fileno = _socket.socket(AF_RDS, _socket.SOCK_SEQPACKET, 0).detach()
        flags = fcntl.fcntl(fileno, fcntl.F_GETFL)
        if created:
            flags &= ~os.O_NONBLOCK  # a new RDSSocket is blocking, whatever socket.setdefaulttimeout() says
        try:
            self._v4 = _View(_socket.AF_INET, _socket.SOCK_SEQPACKET, 0, fileno)
            self._v6 = _View(_socket.AF_INET6, _socket.SOCK_SEQPACKET, 0, fileno)
        except BaseException:
            if created:
                os.close(fileno)
            raise
        self._owner = self._v4.owner = self._v6.owner = _Fd(fileno)
        if _socket.getdefaulttimeout() is not None:
            # a stdlib socket object takes the process-wide default timeout and makes its fd non-blocking;
            # an RDSSocket starts with timeout None and an adopted fd keeps its blocking mode
            self._v4.settimeout(None)
            self._v6.settimeout(None)
            fcntl.fcntl(fileno, fcntl.F_SETFL, flags)
        self._calls = _data_calls(self._v4, self._v6, FASTCALL)
        # the instance's own attributes: s.recv(...) calls the closure (or the C method) with no Python
        # method in between; a subclass that overrides a data call keeps its override. fileno() likewise is
        # the view's C method, as on a stdlib socket (selectors, asyncio's sock_* and pyrds stress ask for it
        # on every wait): the fd, and -1 once close() or detach() detached the views
        cls = type(self)
        for name, fn in (*self._calls.items(), ("fileno", self._v4.fileno)):
            if getattr(cls, name) is getattr(RDSSocket, name):
                self.__dict__[name] = fn

    # -- helpers
    def _check_open(self) -> int:
        fd = self._owner.fd
        if fd < 0:
            raise os_error(errno.EBADF)
        return fd

    def _view_for(self, address: Any) -> tuple[_View, SockAddr]:
        v6, addr = route(address)
        return (self._v6 if v6 else self._v4), addr

    # -- addressing
    def bind(self, address: SockAddr) -> None:
        view, addr = self._view_for(address)
        view.bind(addr)

    def connect(self, address: SockAddr) -> None:
        view, addr = self._view_for(address)
        view.connect(addr)

    def _name(self, name: Any) -> SockAddr:
        if type(name[0]) is int:  # CPython's (sa_family, sa_data) for a family it does not know
            if name[0] == _socket.AF_UNSPEC:
                # the kernel reports AF_UNSPEC for an unbound, unconnected socket
                return ("0.0.0.0", 0)
            raise os_error(errno.EAFNOSUPPORT, f"address family {name[0]}")
        result: SockAddr = name
        return result

    def getsockname(self) -> SockAddr:
        return self._name(self._v6.getsockname())

    def getpeername(self) -> SockAddr:
        return self._name(self._v6.getpeername())

    # -- data (the per-instance closures of _data_calls do the work; these are the class-level entry points)
    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        result: int = self._calls["send"](data, flags)
        return result

    def sendto(self, data: ReadableBuffer, flags_or_address: Any, address: Any = _NOARG, /) -> int:
        result: int = self._calls["sendto"](data, flags_or_address, address)
        return result

    def sendmsg(
        self,
        buffers: Iterable[bytes | bytearray | memoryview],
        ancdata: Iterable[tuple[int, int, bytes]] = (),
        flags: int = 0,
        address: SockAddr | None = None,
    ) -> int:
        result: int = self._calls["sendmsg"](buffers, ancdata, flags, address)
        return result

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        result: bytes = self._calls["recv"](bufsize, flags)
        return result

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, SockAddr]:
        result: tuple[bytes, SockAddr] = self._calls["recvfrom"](bufsize, flags)
        return result

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[bytes, AncData, int, Any]:
        result: tuple[bytes, AncData, int, Any] = self._calls["recvmsg"](bufsize, ancbufsize, flags)
        return result

    def recv_into(self, buffer: WritableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        result: int = self._calls["recv_into"](buffer, nbytes, flags)
        return result

    def recvfrom_into(self, buffer: WritableBuffer, nbytes: int = 0, flags: int = 0) -> tuple[int, SockAddr]:
        result: tuple[int, SockAddr] = self._calls["recvfrom_into"](buffer, nbytes, flags)
        return result

    # -- options
    def setsockopt(self, level: int, optname: int, value: int | bytes) -> None:
        level = _check_int(level, "level")
        optname = _check_int(optname, "optname")
        if isinstance(value, int):
            if not -(1 << 31) <= value < (1 << 32):
                raise OverflowError("option value out of range for a C int")
            # the same four bytes as before for 2**31..2**32-1 (a C int's bit pattern)
            self._v4.setsockopt(level, optname, value if value < (1 << 31) else value - (1 << 32))
            return
        try:
            memoryview(value)
        except TypeError:
            raise TypeError(f"value must be a bytes-like object, not {type(value).__name__}") from None
        self._v4.setsockopt(level, optname, value)

    def getsockopt(self, level: int, optname: int, buflen: int = 0) -> int | bytes:
        level = _check_int(level, "level")
        optname = _check_int(optname, "optname")
        buflen = _check_int(buflen, "buflen")
        if buflen < 0:
            raise ValueError("buflen must be >= 0")
        if buflen == 0:
            value: int = self._v4.getsockopt(level, optname)
            return value
        if buflen <= _STDLIB_OPTLEN_MAX:
            raw: bytes = self._v4.getsockopt(level, optname, buflen)
            return raw
        fd = self._check_open()
        buf = ctypes.create_string_buffer(buflen)
        _ret, optlen = libc.getsockopt(fd, level, optname, buf, buflen)
        return buf.raw[: min(optlen, buflen)]

    def get_info_raw(self, info_type: int) -> tuple[int, bytes]:
        """One RDS_INFO table as ``(record size, bytes)``: probe with len 0, grow on ENOSPC, retry."""
        info_type = _check_int(info_type, "info_type")
        fd = self._check_open()
        size = 0
        for _ in range(_MAX_INFO_ATTEMPTS):
            buf = ctypes.create_string_buffer(size) if size else None
            ret, err, optlen = libc.getsockopt_raw(fd, SOL_RDS, info_type, buf, size)
            if ret >= 0:
                raw = buf.raw[:optlen] if buf is not None else b""
                return ret, raw
            if err != errno.ENOSPC:
                raise os_error(err)
            # the table can grow between calls: leave headroom
            size = max(optlen + optlen // 4 + 256, size * 2)
        raise os_error(errno.ENOSPC, "RDS info table kept growing")

    def get_info(self, info_type: int) -> Sequence[Any]:
        each, raw = self.get_info_raw(info_type)
        if raw and each != _info.record_size(info_type):
            raise OSError(errno.EPROTO, f"kernel record size {each} != {_info.record_size(info_type)}")
        return _info.parse_info(info_type, raw)

    def set_tos(self, tos: int) -> None:
        tos = _check_int(tos, "tos")
        if not 0 <= tos <= 255:
            raise ValueError("tos must be 0-255")
        fcntl.ioctl(self._check_open(), SIOCRDSSETTOS, struct.pack("B", tos))

    def get_tos(self) -> int:
        raw = fcntl.ioctl(self._check_open(), SIOCRDSGETTOS, b"\0")
        return int(raw[0])

    # -- fd and blocking
    def fileno(self) -> int:
        return self._owner.fd  # (an instance's own fileno is its view's C method: __init__)

    def settimeout(self, timeout: float | None) -> None:
        timeout = timeout_arg(timeout)
        self._check_open()
        self._v4.settimeout(timeout)
        self._v6.settimeout(timeout)
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def close(self) -> None:
        """Close the fd now; every data call of this socket, also one taken from it, raises EBADF."""
        self._detach_views()
        self._owner.close()

    def detach(self) -> int:
        """Give up the fd without closing it; the socket object is closed (calls raise EBADF)."""
        self._detach_views()
        return self._owner.detach()

    def _detach_views(self) -> None:
        for name in ("_v4", "_v6"):
            view = self.__dict__.get(name)
            if view is not None:
                view.detach()

    # no __del__: the fd closes with its _Fd, when neither this socket nor a data call taken from it is left
