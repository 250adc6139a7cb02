"""Thin ctypes bindings to the libc socket calls the kernel backend needs.

The kernel backend's data calls, addresses and ordinary options go through CPython's socket module (see
pyrds/kernel/socket.py); ctypes is left for what the stdlib cannot do: getsockopt buffers over 1024 bytes
(CPython's cap) and the RDS_INFO size probe (a failing getsockopt whose optlen must be read back), plus
``setns`` for namespace helpers. The msghdr/cmsg helpers stay for tests and tools that build raw messages.
libc is loaded lazily (first call), never at import time. Every wrapper raises ``OSError(errno, strerror)``
on failure and retries on EINTR (PEP 475 semantics).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import Any

c_int = ctypes.c_int
c_uint = ctypes.c_uint
c_size_t = ctypes.c_size_t
c_ssize_t = ctypes.c_ssize_t
c_void_p = ctypes.c_void_p
socklen_t = ctypes.c_uint32

POLLIN = 0x001
POLLPRI = 0x002
POLLOUT = 0x004
POLLERR = 0x008
POLLHUP = 0x010
POLLNVAL = 0x020

SOCK_SEQPACKET = 5
SOCK_NONBLOCK = 0o4000
SOCK_CLOEXEC = 0o2000000
MSG_PEEK = 0x02
MSG_TRUNC = 0x20
MSG_CTRUNC = 0x08
MSG_DONTWAIT = 0x40
CLONE_NEWNET = 0x40000000


class iovec(ctypes.Structure):
    _fields_ = [("iov_base", c_void_p), ("iov_len", c_size_t)]


class msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", c_void_p),
        ("msg_namelen", socklen_t),
        ("msg_iov", ctypes.POINTER(iovec)),
        ("msg_iovlen", c_size_t),
        ("msg_control", c_void_p),
        ("msg_controllen", c_size_t),
        ("msg_flags", c_int),
    ]


class cmsghdr(ctypes.Structure):
    _fields_ = [("cmsg_len", c_size_t), ("cmsg_level", c_int), ("cmsg_type", c_int)]


class pollfd(ctypes.Structure):
    _fields_ = [("fd", c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


_ALIGN = ctypes.sizeof(c_size_t)


def cmsg_align(length: int) -> int:
    """``CMSG_ALIGN``."""
    return (length + _ALIGN - 1) & ~(_ALIGN - 1)


def cmsg_len(length: int) -> int:
    """``CMSG_LEN``: header plus ``length`` data bytes (the value of ``cmsg_len``)."""
    return cmsg_align(ctypes.sizeof(cmsghdr)) + length


def cmsg_space(length: int) -> int:
    """``CMSG_SPACE``: bytes a control message with ``length`` data bytes occupies in the buffer."""
    return cmsg_align(ctypes.sizeof(cmsghdr)) + cmsg_align(length)


def pack_cmsgs(items: list[tuple[int, int, bytes]]) -> bytes:
    """Serialize ``(level, type, data)`` items into a control buffer."""
    out = bytearray()
    for level, ctype, data in items:
        hdr = cmsghdr(cmsg_len(len(data)), level, ctype)
        chunk = bytes(hdr) + bytes(cmsg_align(ctypes.sizeof(cmsghdr)) - ctypes.sizeof(cmsghdr)) + data
        out += chunk + bytes(cmsg_space(len(data)) - len(chunk))
    return bytes(out)


def unpack_cmsgs(buf: bytes) -> list[tuple[int, int, bytes]]:
    """Parse a control buffer (``msg_controllen`` bytes) into ``(level, type, data)`` items."""
    items: list[tuple[int, int, bytes]] = []
    hdr_size = ctypes.sizeof(cmsghdr)
    off = 0
    while off + hdr_size <= len(buf):
        hdr = cmsghdr.from_buffer_copy(buf, off)
        if hdr.cmsg_len < hdr_size:
            break
        start = off + cmsg_align(hdr_size)
        end = min(off + hdr.cmsg_len, len(buf))
        items.append((hdr.cmsg_level, hdr.cmsg_type, bytes(buf[start:end])))
        off += cmsg_align(hdr.cmsg_len)
    return items


class _Libc:
    """The loaded libc with argtypes set; created on first use."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("c") or "libc.so.6"
        lib = ctypes.CDLL(name, use_errno=True)
        self.lib = lib
        sig: dict[str, tuple[Any, list[Any]]] = {
            "socket": (c_int, [c_int, c_int, c_int]),
            "bind": (c_int, [c_int, c_void_p, socklen_t]),
            "connect": (c_int, [c_int, c_void_p, socklen_t]),
            "sendmsg": (c_ssize_t, [c_int, ctypes.POINTER(msghdr), c_int]),
            "recvmsg": (c_ssize_t, [c_int, ctypes.POINTER(msghdr), c_int]),
            "getsockopt": (c_int, [c_int, c_int, c_int, c_void_p, ctypes.POINTER(socklen_t)]),
            "setsockopt": (c_int, [c_int, c_int, c_int, c_void_p, socklen_t]),
            "getsockname": (c_int, [c_int, c_void_p, ctypes.POINTER(socklen_t)]),
            "getpeername": (c_int, [c_int, c_void_p, ctypes.POINTER(socklen_t)]),
            "ioctl": (c_int, [c_int, ctypes.c_ulong, c_void_p]),
            "close": (c_int, [c_int]),
            "poll": (c_int, [ctypes.POINTER(pollfd), ctypes.c_ulong, c_int]),
            "setns": (c_int, [c_int, c_int]),
        }
        for fname, (restype, argtypes) in sig.items():
            fn = getattr(lib, fname)
            fn.restype = restype
            fn.argtypes = argtypes


_LIBC: _Libc | None = None


def libc() -> Any:
    """The ctypes libc handle (loaded on first call)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = _Libc()
    return _LIBC.lib


def _raise() -> None:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code))


def _call(fname: str, *args: Any) -> int:
    fn = getattr(libc(), fname)
    while True:
        ret = int(fn(*args))
        if ret >= 0:
            return ret
        if ctypes.get_errno() == errno.EINTR:
            continue
        _raise()


def socket(family: int, type_: int, proto: int) -> int:
    return _call("socket", family, type_, proto)


def bind(fd: int, addr: ctypes.Structure) -> None:
    _call("bind", fd, ctypes.addressof(addr), ctypes.sizeof(addr))


def connect(fd: int, addr: ctypes.Structure) -> None:
    _call("connect", fd, ctypes.addressof(addr), ctypes.sizeof(addr))


def sendmsg(fd: int, msg: msghdr, flags: int) -> int:
    return _call("sendmsg", fd, ctypes.byref(msg), flags)


def recvmsg(fd: int, msg: msghdr, flags: int) -> int:
    return _call("recvmsg", fd, ctypes.byref(msg), flags)


def getsockopt(fd: int, level: int, optname: int, buf: Any, length: int) -> tuple[int, int]:
    """``getsockopt``: returns ``(return value, optlen)``; ``buf`` may be None when ``length`` is 0."""
    optlen = socklen_t(length)
    ptr = ctypes.addressof(buf) if buf is not None else None
    ret = _call("getsockopt", fd, level, optname, ptr, ctypes.byref(optlen))
    return ret, int(optlen.value)


def getsockopt_raw(fd: int, level: int, optname: int, buf: Any, length: int) -> tuple[int, int, int]:
    """``getsockopt`` without raising: ``(return value, errno, optlen)`` (for the RDS_INFO size loop)."""
    optlen = socklen_t(length)
    ptr = ctypes.addressof(buf) if buf is not None else None
    fn = libc().getsockopt
    while True:
        ret = int(fn(fd, level, optname, ptr, ctypes.byref(optlen)))
        err = ctypes.get_errno() if ret < 0 else 0
        if err != errno.EINTR:
            return ret, err, int(optlen.value)


def setsockopt(fd: int, level: int, optname: int, buf: Any, length: int) -> None:
    ptr = ctypes.addressof(buf) if buf is not None else None
    _call("setsockopt", fd, level, optname, ptr, length)


def _name(fname: str, fd: int) -> bytes:
    from pyrds.uapi import sockaddr_storage

    ss = sockaddr_storage()
    length = socklen_t(ctypes.sizeof(ss))
    _call(fname, fd, ctypes.addressof(ss), ctypes.byref(length))
    return ctypes.string_at(ctypes.addressof(ss), min(length.value, ctypes.sizeof(ss)))


def getsockname(fd: int) -> bytes:
    return _name("getsockname", fd)


def getpeername(fd: int) -> bytes:
    return _name("getpeername", fd)


def ioctl(fd: int, request: int, arg: Any) -> int:
    return _call("ioctl", fd, request, ctypes.addressof(arg))


def close(fd: int) -> None:
    # never retry close on EINTR (the fd is gone on Linux)
    if int(libc().close(fd)) < 0:
        if ctypes.get_errno() != errno.EINTR:
            _raise()


def poll(fd: int, events: int, timeout_ms: int) -> int:
    """Poll one fd; returns revents (0 on timeout). EINTR is reported as 0 so callers recompute deadlines."""
    p = pollfd(fd, events, 0)
    ret = int(libc().poll(ctypes.byref(p), 1, timeout_ms))
    if ret < 0:
        if ctypes.get_errno() == errno.EINTR:
            return 0
        _raise()
    return int(p.revents) if ret else 0


def setns(fd: int, nstype: int) -> None:
    _call("setns", fd, nstype)
