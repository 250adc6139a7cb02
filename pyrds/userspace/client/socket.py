"""``RDSSocket``: the userspace backend's socket, a control connection to the namespace's stack service.

The data path uses the binary SEND/RECV records of :mod:`pyrds.userspace.rpc`; every other call is one
``(op, args)`` request. Blocking calls wait on the readiness fd (``fileno()``), never in the service.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pyrds import info
from pyrds.addr import SockAddr, format_address, parse_address
from pyrds.api import (
    AncData,
    BackendName,
    RDSSocketBase,
    c_int,
    c_ssize,
    int_arg,
    os_error,
    readable_view,
    send_ancdata,
    send_buffers,
    timeout_arg,
)
from pyrds.constants import RDS_MAX_MSG_SIZE
from pyrds.userspace import rpc
from pyrds.userspace.client.autostart import connect_stack

_CONG_POLL = 0.005  # blocking send to a congested port re-checks this often (the kernel sleeps on the map)
_POLLIN = select.POLLIN
_SEND_REQ = rpc.SEND_REQ
_RECV_REQ = rpc.RECV_REQ
#: a bytes option value is shipped up to this length: no option reads more (the largest, RDS_GET_MR_FOR_DEST's
#: struct, is 160 bytes; every length check is "< n" or "!= n" with n <= 160), as the kernel copies only the
#: struct it needs from a longer optval, so a huge value behaves as on the kernel instead of failing to cross
#: the control connection
_OPTVAL_MAX = 4096


_dests: dict[Any, tuple[bytes, int]] = {}
_sources: dict[tuple[bytes, int, int], SockAddr] = {}


def _pack_dest(address: Any) -> tuple[bytes, int]:
    """(packed IP, port) of a destination; the common plain (str, int) tuples are cached."""
    cacheable = (
        type(address) is tuple
        and type(address[0]) is str
        and all(type(v) is int for v in address[1:])
        and len(address) in (2, 4)
    )
    if cacheable:
        hit = _dests.get(address)
        if hit is not None:
            return hit
    a = parse_address(address)
    out = (a.ip.packed, int(a.port))
    if cacheable:
        if len(_dests) > 1024:
            _dests.clear()
        _dests[address] = out
    return out


def _source(raw: bytes, port: int, scope: int) -> SockAddr:
    key = (raw, port, scope)
    addr = _sources.get(key)
    if addr is None:
        if len(_sources) > 1024:
            _sources.clear()
        addr = _sources[key] = format_address(ipaddress.ip_address(raw), port, scope)
    return addr


def _iterable(buffers: Any) -> Any:
    """``sendmsg``'s buffers: a list as is (the common case), else checked like the stdlib."""
    return buffers if type(buffers) is list else send_buffers(buffers)


def _refusal(ctl: socket.socket) -> int:
    """The errno of a refusal record the service left on a control connection it then closed (it had no
    descriptor or memory for it), else 0. Called after the connection failed: never blocks."""
    try:
        data = ctl.recv(4096, socket.MSG_DONTWAIT)
        if not data or data[0] != rpc.LAST:
            return 0
        code, _ = rpc.decode(data[1:])
    except (OSError, rpc.ConnectionClosed, TypeError, ValueError):
        return 0
    return code if isinstance(code, int) and code > 0 else 0


def _raise(code: int, optlen: Any) -> None:
    if code == rpc.WAIT_CONG:
        raise OSError(rpc.WAIT_CONG, "destination congested")
    exc = os_error(code)
    if optlen is not None:
        exc.optlen = optlen  # type: ignore[attr-defined]
    raise exc


class RDSSocket(RDSSocketBase):
    """An RDS socket served by the userspace stack of this network namespace."""

    __module__ = "pyrds.userspace.client"  # its public home: repr() names it as before the client package
    backend: BackendName = "userspace"

    def __init__(self, type: int = socket.SOCK_SEQPACKET, proto: int = 0) -> None:
        if type != socket.SOCK_SEQPACKET or proto != 0:
            raise os_error(errno.ESOCKTNOSUPPORT)
        self._lock = threading.Lock()
        self._timeout: float | None = None
        self._ctl: socket.socket | None = connect_stack()
        self._limit = rpc.tune(self._ctl)
        self._v6 = False
        fds: list[int] = []
        try:
            self.sock_id = self._call(rpc.Op.OPEN, (), want_fds=1, fds_out=fds)
            if not fds:  # the readiness fd was dropped: this process is out of descriptors (MSG_CTRUNC)
                raise os_error(errno.EMFILE)
        except BaseException:
            self._ctl.close()
            raise
        self._fd = fds[0]

    # -- RPC
    def _call(self, op: int, args: Any, want_fds: int = 0, fds_out: list[int] | None = None) -> Any:
        with self._lock:
            ctl = self._ctl
            if ctl is None:
                raise os_error(errno.EBADF)
            try:
                rpc.send_record(ctl, rpc.encode((int(op), args)), None, self._limit)
                raw, fds = rpc.recv_record(ctl, want_fds)
                code, result = rpc.decode(raw)
            except (rpc.ConnectionClosed, BrokenPipeError, ConnectionResetError):
                code = _refusal(ctl)
                if code:  # a service out of descriptors or memory answered and closed (server.py _shed)
                    raise os_error(code) from None
                raise os_error(errno.EPIPE, "the pyrds stack service went away") from None
        if fds_out is not None:
            fds_out.extend(fds)
        if code:
            _raise(code, result)
        return result

    def _fast(self, parts: list[rpc.Buffer]) -> memoryview:
        """One binary request; the reply is a view of this thread's receive buffer (parse it at once)."""
        with self._lock:
            ctl = self._ctl
            if ctl is None:
                raise os_error(errno.EBADF)
            try:
                rpc.send_parts(ctl, parts, self._limit)
                raw, _fds = rpc.recv_record(ctl)
            except (rpc.ConnectionClosed, BrokenPipeError, ConnectionResetError):
                raise os_error(errno.EPIPE, "the pyrds stack service went away") from None
        return memoryview(raw)

    def _send_once(self, buffers: list[rpc.Buffer], anc: bytes, flags: int, dest: Any, nonblock: bool) -> int:
        daddr, dport = dest if dest is not None else (b"", 0)
        head = _SEND_REQ.pack(rpc.TAG_SEND, flags, nonblock, len(daddr), dport, len(anc))
        rep = self._fast([head, daddr, anc, *buffers])
        try:
            code, n = rpc.SEND_REP.unpack_from(rep)
        except struct.error:
            raise os_error(errno.EPIPE, "bad reply from the pyrds stack service") from None
        if code:
            _raise(code, None)
        return int(n)

    def _recv_once(
        self, bufsize: int, ancbufsize: int, flags: int, nonblock: bool
    ) -> tuple[bytes, Any, int, Any]:
        rep = self._fast([_RECV_REQ.pack(rpc.TAG_RECV, bufsize, ancbufsize, flags, nonblock)])
        try:
            code, mflags, port, scope, alen, anclen = rpc.RECV_REP.unpack_from(rep)
            if code:
                _raise(code, None)
            off = rpc.RECV_REP.size
            src = _source(bytes(rep[off : off + alen]), port, scope) if alen else None
            off += alen
            anc = [tuple(a) for a in rpc.decode(rep[off : off + anclen])] if anclen else []
            data = bytes(rep[off + anclen :])
        except (struct.error, EOFError, ValueError, TypeError):
            raise os_error(errno.EPIPE, "bad reply from the pyrds stack service") from None
        return data, anc, mflags, src

    def _wait(self, events: int, deadline: float | None) -> bool:
        """poll() the readiness fd; False on timeout."""
        p = select.poll()
        p.register(self._fd, events)
        while True:
            if deadline is None:
                ms = -1
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                ms = max(1, int(left * 1000))
            if p.poll(ms):
                return True

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    # -- addressing
    def bind(self, address: SockAddr) -> None:
        a = parse_address(address)
        self._v6 = a.ip.version == 6
        self._call(rpc.Op.BIND, (str(a.ip), a.port, a.scope_id))

    def connect(self, address: SockAddr) -> None:
        a = parse_address(address)
        self._call(rpc.Op.CONNECT, (str(a.ip), a.port, a.ip.version == 6))

    def getsockname(self) -> SockAddr:
        host, port, scope, conn = self._call(rpc.Op.GETSOCKNAME, ())
        if host is None:
            if conn is not None and ":" in conn:
                return ("::", 0, 0, 0)
            return ("0.0.0.0", 0)
        return format_address(parse_address((host, 0)).ip, port, scope)

    def getpeername(self) -> SockAddr:
        host, port, scope = self._call(rpc.Op.GETPEERNAME, ())
        return format_address(parse_address((host, 0)).ip, port, scope)

    # -- data
    def sendmsg(
        self,
        buffers: Iterable[bytes | bytearray | memoryview],
        ancdata: Iterable[tuple[int, int, bytes]] = (),
        flags: int = 0,
        address: SockAddr | None = None,
    ) -> int:
        # the stdlib's checks, in its order, before any request: flags and address, then the data (bytes-like
        # only: TypeError), then the ancillary items
        flags = c_int(flags)
        dest = None if address is None else _pack_dest(address)
        bufs: list[rpc.Buffer] = [b if type(b) is bytes else readable_view(b) for b in _iterable(buffers)]
        anc = send_ancdata(ancdata) if ancdata else []
        # CPython's rules: no timeout -> the call blocks unless MSG_DONTWAIT; timeout 0 -> non-blocking;
        # timeout > 0 -> the fd is non-blocking for the kernel, CPython polls first and retries on EAGAIN.
        timed = bool(self._timeout)
        blocking = self._timeout is None and not flags & socket.MSG_DONTWAIT
        deadline = self._deadline()
        raw_anc = rpc.encode(anc) if anc else b""
        size = sum(len(b) for b in bufs)
        oversize = size > RDS_MAX_MSG_SIZE
        if oversize:
            # more than any RDS message (EMSGSIZE), possibly more than a control record holds: the stack
            # gets the size instead of the bytes and answers with the kernel's error for it
            gdest = None if dest is None else (str(ipaddress.ip_address(dest[0])), dest[1])
            n: int = self._call(rpc.Op.SEND, (size, anc, flags, gdest, not blocking))
            return n
        if timed and not self._wait(select.POLLOUT, deadline):
            raise TimeoutError("timed out")
        while True:
            try:
                return self._send_once(bufs, raw_anc, flags, dest, not blocking)
            except OSError as exc:
                if not (blocking or timed) or exc.errno not in (errno.EAGAIN, rpc.WAIT_CONG):
                    raise
                if exc.errno == errno.EAGAIN:
                    ok = self._wait(select.POLLOUT, deadline)
                else:  # congested destination: the kernel sleeps on the map's waitqueue
                    time.sleep(_CONG_POLL)
                    ok = True
                if not ok:
                    raise TimeoutError("timed out") from None

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        bufsize, flags = c_ssize(bufsize), c_int(flags)
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        return self.recvmsg(bufsize, 0, flags)[0]

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, SockAddr]:
        bufsize, flags = c_ssize(bufsize), c_int(flags)
        if bufsize < 0:
            raise ValueError("negative buffersize in recvfrom")
        data, _anc, _flags, addr = self.recvmsg(bufsize, 0, flags)
        sender: SockAddr = addr
        return data, sender

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[bytes, AncData, int, Any]:
        bufsize, ancbufsize, flags = c_ssize(bufsize), c_ssize(ancbufsize), c_int(flags)
        if bufsize < 0:
            raise ValueError("negative buffer size in recvmsg()")
        if ancbufsize < 0:
            raise ValueError("invalid ancillary data buffer length")
        timed = bool(self._timeout)
        blocking = self._timeout is None and not flags & socket.MSG_DONTWAIT
        deadline = self._deadline()
        fast = bufsize < 1 << 62 and ancbufsize < 1 << 62
        # Nothing to read shows on the readiness fd (the service keeps its POLLIN exact): a non-blocking
        # recv then fails with EAGAIN without a round trip; a blocking one waits before asking.
        local = fast and not flags & socket.MSG_OOB
        while True:
            if timed:
                if not self._wait(select.POLLIN, deadline):
                    raise TimeoutError("timed out")
            elif local and not self._readable():
                if not blocking:
                    raise os_error(errno.EAGAIN)
                self._wait(select.POLLIN, None)
                continue
            try:
                if fast:
                    data, anc, mflags, addr = self._recv_once(bufsize, ancbufsize, flags, not blocking)
                else:
                    args = (bufsize, ancbufsize, flags, not blocking)
                    data, anc, mflags, src = self._call(rpc.Op.RECV, args)
                    anc = [tuple(a) for a in anc]
                    if src is not None:
                        src = _source(ipaddress.ip_address(src[0]).packed, src[1], src[2])
                    addr = src
                return data, anc, mflags, addr
            except OSError as exc:
                if not (blocking or timed) or exc.errno != errno.EAGAIN:
                    raise
                if blocking:
                    self._wait(select.POLLIN, None)

    def _readable(self) -> bool:
        if self._ctl is None:
            return True  # the request fails with EBADF
        p = select.poll()
        p.register(self._fd, _POLLIN)
        return bool(p.poll(0))

    # -- options (checked like the kernel backend before any request)
    def setsockopt(self, level: int, optname: int, value: int | bytes) -> None:
        level, optname = int_arg(level, "level"), int_arg(optname, "optname")
        v: int | bytes
        if isinstance(value, int):
            if not -(1 << 31) <= value < (1 << 32):
                raise OverflowError("option value out of range for a C int")
            v = int(value) if value < (1 << 31) else int(value) - (1 << 32)  # a C int's bit pattern
        else:
            try:
                view = memoryview(value)
            except TypeError:
                raise TypeError(f"value must be a bytes-like object, not {type(value).__name__}") from None
            v = view.cast("B")[:_OPTVAL_MAX].tobytes() if view.c_contiguous else view.tobytes()[:_OPTVAL_MAX]
        self._call(rpc.Op.SETSOCKOPT, (level, optname, v))

    def getsockopt(self, level: int, optname: int, buflen: int = 0) -> int | bytes:
        level, optname = int_arg(level, "level"), int_arg(optname, "optname")
        buflen = int_arg(buflen, "buflen")
        if buflen < 0:
            raise ValueError("buflen must be >= 0")
        if buflen > 1 << 30:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        result: int | bytes = self._call(rpc.Op.GETSOCKOPT, (level, optname, buflen))
        return result

    def get_info(self, info_type: int) -> Sequence[Any]:
        raw = self._call(rpc.Op.INFO, (int(info_type),))
        return info.parse_info(info_type, raw)

    def set_tos(self, tos: int) -> None:
        tos = int_arg(tos, "tos")
        if not 0 <= tos <= 255:
            raise ValueError("tos must be 0-255")
        self._call(rpc.Op.SET_TOS, (tos,))

    def get_tos(self) -> int:
        tos: int = self._call(rpc.Op.GET_TOS, ())
        return tos

    def sysctl_get(self) -> dict[str, int]:
        """The stack's sysctl-like settings (ping_enable, reconnect_*_delay_ms, ...)."""
        values: dict[str, int] = self._call(rpc.Op.SYSCTL_GET, ())
        return values

    def sysctl_set(self, name: str, value: int) -> None:
        self._call(rpc.Op.SYSCTL_SET, (name, int(value)))

    # -- fd and blocking
    def fileno(self) -> int:
        if self._ctl is None:
            return -1
        return self._fd

    def settimeout(self, timeout: float | None) -> None:
        timeout = timeout_arg(timeout)
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def close(self) -> None:
        with self._lock:
            if self._ctl is None:
                return
            self._ctl.close()
            self._ctl = None
            os.close(self._fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
