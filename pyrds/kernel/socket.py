"""The native backend: an AF_RDS socket driven through libc with ctypes.

Timeouts work like CPython's socket module: ``settimeout(None)`` leaves the fd blocking; ``settimeout(0)``
makes it non-blocking (EAGAIN raises ``BlockingIOError``); ``settimeout(t > 0)`` makes the fd non-blocking
and each call retries after ``poll()`` until the deadline, then raises ``TimeoutError("timed out")`` (errno
None, exactly what CPython raises). Kernel errors (ENOBUFS for a congested peer, ENOTCONN, ...) pass through
as ``OSError(errno, strerror)``. The userspace backend must behave the same way.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import math
import os
import socket as _socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from pyrds import info as _info
from pyrds import uapi
from pyrds.addr import RDSAddress, SockAddr, parse_address
from pyrds.api import AncData, BackendName, RDSSocketBase, os_error
from pyrds.constants import AF_RDS, SIOCRDSGETTOS, SIOCRDSSETTOS, SOL_RDS
from pyrds.kernel import libc

T = TypeVar("T")

_MAX_INFO_ATTEMPTS = 16


def _sockaddr(addr: RDSAddress) -> uapi.sockaddr_in | uapi.sockaddr_in6:
    if addr.ip.version == 6:
        return uapi.make_sockaddr_in6(str(addr.ip), addr.port, addr.flowinfo, addr.scope_id)
    return uapi.make_sockaddr_in(str(addr.ip), addr.port)


def _decode_name(raw: bytes) -> SockAddr:
    if len(raw) >= 2 and int.from_bytes(raw[:2], "little") == _socket.AF_UNSPEC:
        # the kernel reports AF_UNSPEC for an unbound, unconnected socket
        return ("0.0.0.0", 0)
    return uapi.parse_sockaddr(raw)


def _as_bytes(obj: Any, what: str) -> memoryview:
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _buffer_address(mv: memoryview, keep: list[Any]) -> int | None:
    """Address of the caller's bytes without copying (MSG_ZEROCOPY sends straight from them, so the caller
    must keep them unchanged until the completion, as in C); read-only non-bytes buffers are copied."""
    if not len(mv):
        return None
    if not mv.readonly:
        cbuf = (ctypes.c_char * len(mv)).from_buffer(mv)
        keep.append(cbuf)
        return ctypes.addressof(cbuf)
    if isinstance(mv.obj, bytes) and mv.contiguous and mv.nbytes == len(mv.obj):
        ptr = ctypes.cast(ctypes.c_char_p(mv.obj), ctypes.c_void_p).value
        keep.append(mv.obj)
        return ptr
    copy = ctypes.create_string_buffer(mv.tobytes(), len(mv))
    keep.append(copy)
    return ctypes.addressof(copy)


def _check_int(value: Any, what: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be int, not {type(value).__name__}")
    return int(value)


class RDSSocket(RDSSocketBase):
    """An AF_RDS/SOCK_SEQPACKET socket of the running kernel."""

    backend: BackendName = "kernel"

    def __init__(self, fileno: int | None = None) -> None:
        self._fd = -1
        self._timeout: float | None = None
        if fileno is None:
            fileno = libc.socket(AF_RDS, libc.SOCK_SEQPACKET | libc.SOCK_CLOEXEC, 0)
        self._fd = fileno

    # -- helpers
    def _check_open(self) -> int:
        if self._fd < 0:
            raise os_error(errno.EBADF)
        return self._fd

    def _io(self, call: Callable[[], T], events: int) -> T:
        deadline: float | None = None
        while True:
            try:
                return call()
            except OSError as exc:
                if exc.errno != errno.EAGAIN or not self._timeout:
                    raise
            if deadline is None:
                deadline = time.monotonic() + self._timeout
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out")
            libc.poll(self._check_open(), events, max(1, math.ceil(remaining * 1000)))

    # -- addressing
    def bind(self, address: SockAddr) -> None:
        sa = _sockaddr(parse_address(address))
        libc.bind(self._check_open(), sa)

    def connect(self, address: SockAddr) -> None:
        sa = _sockaddr(parse_address(address))
        libc.connect(self._check_open(), sa)

    def getsockname(self) -> SockAddr:
        return _decode_name(libc.getsockname(self._check_open()))

    def getpeername(self) -> SockAddr:
        return _decode_name(libc.getpeername(self._check_open()))

    # -- data
    def sendmsg(
        self,
        buffers: Iterable[bytes | bytearray | memoryview],
        ancdata: Iterable[tuple[int, int, bytes]] = (),
        flags: int = 0,
        address: SockAddr | None = None,
    ) -> int:
        flags = _check_int(flags, "flags")
        bufs = [_as_bytes(b, "buffers item") for b in buffers]
        items: list[tuple[int, int, bytes]] = []
        for item in ancdata:
            if not isinstance(item, tuple) or len(item) != 3:
                raise TypeError("ancillary data items must be (level, type, data) tuples")
            level, ctype, data = item
            items.append(
                (_check_int(level, "level"), _check_int(ctype, "type"), bytes(_as_bytes(data, "data")))
            )
        sa = _sockaddr(parse_address(address)) if address is not None else None
        fd = self._check_open()

        keep: list[Any] = []
        iov = (libc.iovec * max(1, len(bufs)))()
        for i, mv in enumerate(bufs):
            iov[i].iov_base = _buffer_address(mv, keep)
            iov[i].iov_len = len(mv)
        msg = libc.msghdr()
        msg.msg_iov = ctypes.cast(iov, ctypes.POINTER(libc.iovec))
        msg.msg_iovlen = len(bufs)
        if sa is not None:
            msg.msg_name = ctypes.addressof(sa)
            msg.msg_namelen = ctypes.sizeof(sa)
        if items:
            control = ctypes.create_string_buffer(libc.pack_cmsgs(items))
            keep.append(control)
            msg.msg_control = ctypes.addressof(control)
            msg.msg_controllen = len(control.raw) - 1  # create_string_buffer adds a NUL
        return self._io(lambda: libc.sendmsg(fd, msg, flags), libc.POLLOUT)

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[bytes, AncData, int, Any]:
        bufsize = _check_int(bufsize, "bufsize")
        ancbufsize = _check_int(ancbufsize, "ancbufsize")
        flags = _check_int(flags, "flags")
        if bufsize < 0:
            raise ValueError("negative buffer size in recvmsg()")
        if ancbufsize < 0:
            raise ValueError("negative ancillary buffer size in recvmsg()")
        fd = self._check_open()
        data = ctypes.create_string_buffer(max(1, bufsize))
        control = ctypes.create_string_buffer(max(1, ancbufsize))
        name = uapi.sockaddr_storage()
        iov = libc.iovec(ctypes.addressof(data), bufsize)
        msg = libc.msghdr()

        def call() -> int:
            msg.msg_name = ctypes.addressof(name)
            msg.msg_namelen = ctypes.sizeof(name)
            msg.msg_iov = ctypes.pointer(iov)
            msg.msg_iovlen = 1
            msg.msg_control = ctypes.addressof(control) if ancbufsize else None
            msg.msg_controllen = ancbufsize
            msg.msg_flags = 0
            return libc.recvmsg(fd, msg, flags)

        n = self._io(call, libc.POLLIN)
        payload = data.raw[: min(n, bufsize)]
        anc = libc.unpack_cmsgs(control.raw[: msg.msg_controllen]) if ancbufsize else []
        address: Any = None
        if msg.msg_namelen:
            raw = ctypes.string_at(ctypes.addressof(name), min(msg.msg_namelen, ctypes.sizeof(name)))
            address = _decode_name(raw)
        return payload, anc, int(msg.msg_flags), address

    # -- options
    def setsockopt(self, level: int, optname: int, value: int | bytes) -> None:
        level = _check_int(level, "level")
        optname = _check_int(optname, "optname")
        buf: Any
        if isinstance(value, int):
            if not -(1 << 31) <= value < (1 << 32):
                raise OverflowError("option value out of range for a C int")
            buf = ctypes.c_int(value if value < (1 << 31) else value - (1 << 32))
            length = ctypes.sizeof(buf)
        else:
            raw = bytes(_as_bytes(value, "value"))
            buf = ctypes.create_string_buffer(raw, max(1, len(raw)))
            length = len(raw)
        libc.setsockopt(self._check_open(), level, optname, buf, length)

    def getsockopt(self, level: int, optname: int, buflen: int = 0) -> int | bytes:
        level = _check_int(level, "level")
        optname = _check_int(optname, "optname")
        buflen = _check_int(buflen, "buflen")
        if buflen < 0:
            raise ValueError("buflen must be >= 0")
        fd = self._check_open()
        if buflen == 0:
            val = ctypes.c_int(0)
            libc.getsockopt(fd, level, optname, val, ctypes.sizeof(val))
            return int(val.value)
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
        libc.ioctl(self._check_open(), SIOCRDSSETTOS, ctypes.c_uint8(tos))

    def get_tos(self) -> int:
        val = ctypes.c_uint8(0)
        libc.ioctl(self._check_open(), SIOCRDSGETTOS, val)
        return int(val.value)

    # -- fd and blocking
    def fileno(self) -> int:
        return self._fd

    def settimeout(self, timeout: float | None) -> None:
        if timeout is not None:
            if not isinstance(timeout, int | float) or isinstance(timeout, bool):
                raise TypeError("timeout must be a float or None")
            timeout = float(timeout)
            if math.isnan(timeout) or timeout < 0:
                raise ValueError("Timeout value out of range")
        fd = self._check_open()
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        nonblock = timeout is not None
        fcntl.fcntl(fd, fcntl.F_SETFL, (fl | os.O_NONBLOCK) if nonblock else (fl & ~os.O_NONBLOCK))
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            libc.close(fd)

    def detach(self) -> int:
        fd, self._fd = self._fd, -1
        return fd

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            try:
                self.close()
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"<pyrds.kernel.RDSSocket fd={self._fd} timeout={self._timeout}>"
