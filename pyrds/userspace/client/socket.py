"""``RDSSocket``: the userspace backend's socket, a control connection to the namespace's stack service.

Received messages come without a request: the service pushes them into the socket's data channel (an
AF_UNIX SOCK_SEQPACKET end, ``service/datachannel.py``), ``recv`` reads one there and tells the service with
a CONSUMED notice it does not wait for. What the service cannot push (a message with ancillary data, one too
large for the channel) is asked for with a binary RECV record; sends are binary SEND records; every other call
is one ``(op, args)`` request. Blocking calls wait on the readiness fd (``fileno()``) and the data channel,
never in the service.
"""

from __future__ import annotations

import errno
import ipaddress
import mmap
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

#: a blocking send to a congested port sends again when the stack's send waker says the map changed
#: (service/sendwaker.py), else after _CONG_WAKE_CAP (a safety net: every way a wait ends wakes it); with no
#: waker (a service that gives none) it asks again every _CONG_POLL
_CONG_WAKE_CAP = 0.1
_CONG_POLL = 0.005
#: the longest a read of a tail pushed with PUSH_BYTE_FOLLOWS waits for that readiness byte (the service sends
#: it right after the push; a service that died closes the fd, which ends the wait at once)
_BYTE_WAIT_MS = 200
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_POLLIN = select.POLLIN
_SEND_REQ = rpc.SEND_REQ
_RECV_REQ = rpc.RECV_REQ
_PUSH_HDR = rpc.PUSH_HDR
_PUSH_TAIL = rpc.PUSH_TAIL
_PUSH_BYTE_FOLLOWS = rpc.PUSH_BYTE_FOLLOWS
_PAGE_COUNT = rpc.PAGE_COUNT
_HDR_SIZE = rpc.PUSH_HDR.size
_CONSUMED = rpc.CONSUMED
_REPORT = rpc.REPORT_COUNTS
_MSG_TRUNC = int(socket.MSG_TRUNC)
_MSG_PEEK = int(socket.MSG_PEEK)
_MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
_MSG_OOB = int(socket.MSG_OOB)
#: a C int's and a ssize_t's ranges: plain ints within them skip c_int/c_ssize (same values, same errors)
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_SSIZE_MAX = (1 << 63) - 1
_local = threading.local()


def _push_buffer(size: int) -> memoryview:
    """This thread's buffer for one pushed message (it grows to the largest asked for)."""
    buf: memoryview | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        buf = _local.buf = memoryview(bytearray(max(size, 65536 + _HDR_SIZE)))
    return buf


#: a bytes option value is shipped up to this length: no option reads more (the largest, RDS_GET_MR_FOR_DEST's
#: struct, is 160 bytes; every length check is "< n" or "!= n" with n <= 160), as the kernel copies only the
#: struct it needs from a longer optval, so a huge value behaves as on the kernel instead of failing to cross
#: the control connection
_OPTVAL_MAX = 4096


_dests: dict[Any, tuple[bytes, int]] = {}
_sources: dict[tuple[bytes, int, int], SockAddr] = {}


def _poll_until(p: select.poll, deadline: float | None) -> list[tuple[int, int]] | None:
    """``p.poll()`` until something is ready (its events) or ``deadline`` passes (None)."""
    while True:
        if deadline is None:
            ms = -1
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ms = max(1, int(left * 1000))
        got = p.poll(ms)
        if got:
            return got


def _pack_dest(address: Any) -> tuple[bytes, int]:
    """(packed IP, port) of a destination; the common plain (str, int) tuples are cached."""
    if type(address) is tuple and len(address) == 2 and type(address[0]) is str and type(address[1]) is int:
        cacheable = True  # (host, port), every send: no generator
    else:
        cacheable = (
            type(address) is tuple
            and len(address) == 4
            and type(address[0]) is str
            and all(type(v) is int for v in address[1:])
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


def _recv_args(bufsize: Any, flags: Any, name: str) -> tuple[int, int]:
    """``recv``/``recvfrom``'s arguments as CPython's ``"n"`` and ``"i"`` formats take them, with its errors
    (the callers skip this for plain ints in range)."""
    size, flag = c_ssize(bufsize), c_int(flags)
    if size < 0:
        raise ValueError(f"negative buffersize in {name}")
    return size, flag


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
    if code == rpc.RETRY_PUSHED:
        raise OSError(rpc.RETRY_PUSHED, "messages waiting in the data channel")
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
        self._lock = threading.RLock()  # a send holds it across its request and its accounting
        self._timeout: float | None = None
        self._ctl: socket.socket | None = connect_stack()
        self._limit = rpc.tune(self._ctl)
        self._v6 = False
        fds: list[int] = []
        try:
            self.sock_id = self._call(rpc.Op.OPEN, (), want_fds=4, fds_out=fds)
            if len(fds) < 4:  # an fd was dropped: this process is out of descriptors (MSG_CTRUNC)
                raise os_error(errno.EMFILE)
            #: the page the service shares with this socket (read-only): byte 0 = report reads synchronously
            self._page = mmap.mmap(fds[2], rpc.SHARED_PAGE, mmap.MAP_SHARED, mmap.PROT_READ)
            #: where this side counts its reads for the service (rpc.REPORT_PAGE), read-write
            self._report = mmap.mmap(fds[3], rpc.REPORT_PAGE, mmap.MAP_SHARED)
            os.close(fds.pop())
            #: messages read from the data channel (with the page's counts: what the stack's queue holds)
            self._pushed_read = 0
            #: what it read from the channel, in the page's sync units (rpc.PAGE_SYNC_AT)
            self._read_charge = 0
            #: bytes and empty messages of every send the stack took (with the page's released counts: its
            #: send buffer), and the grant to post sends without waiting (service/posting.py): destination
            #: and epoch
            self._snd_taken = 0
            self._snd_empty_taken = 0
            self._post_dest: tuple[bytes, int] | None = None
            self._post_epoch = -1
            #: bytes ever taken from the readiness fd (on the report page)
            self._ready_taken = 0
            #: the read end of the send waker (-1: not asked for yet, or the service gave none)
            self._waker = -1
            self._waker_asked = False
            os.close(fds.pop())
        except BaseException:
            for fd in fds:
                os.close(fd)
            self._ctl.close()
            raise
        self._fd = fds[0]
        # socket objects for MSG_DONTWAIT reads; settimeout(None): a default timeout set by the program
        # (socket.setdefaulttimeout) made them non-blocking, and the readiness fd's flags are the user's
        self._ready = socket.socket(fileno=fds[0])
        self._ready.settimeout(None)
        #: the data channel: pushed messages, read here (recv_into's C path)
        self._data = socket.socket(fileno=fds[1])
        self._data.settimeout(None)
        if self.__class__.fileno is RDSSocket.fileno:  # (``type`` is the argument here)
            # the readiness fd's own C method, as a stdlib socket's fileno() (selectors, asyncio's sock_* and
            # pyrds stress ask for it on every wait): -1 once close() closed it, as the method below says
            self.__dict__["fileno"] = self._ready.fileno

    # -- RPC
    def _call(self, op: int, args: Any, want_fds: int = 0, fds_out: list[int] | None = None) -> Any:
        with self._lock:
            ctl = self._ctl
            if ctl is None:
                raise os_error(errno.EBADF)
            try:
                code, result, fds = rpc.request(ctl, op, args, self._limit, want_fds)
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

    def _send_once(
        self,
        buffers: list[rpc.Buffer],
        anc: bytes,
        flags: int,
        dest: Any,
        nonblock: bool,
        waited: bool = False,
    ) -> int:
        """One SEND request; ``waited``: this blocking call already waited for a congested port (the stack
        counts cong_send_blocked once per call, as rds_cong_wait does)."""
        daddr, dport = dest if dest is not None else (b"", 0)
        mode = (rpc.SEND_NONBLOCK if nonblock else 0) | (rpc.SEND_WAITED if waited else 0)
        head = _SEND_REQ.pack(rpc.TAG_SEND, flags, mode, len(daddr), dport, len(anc))
        with self._lock:  # the reply's accounting and grant are taken before another send of this socket
            rep = self._fast([head, daddr, anc, *buffers])
            try:
                code, n, grant = rpc.SEND_REP.unpack_from(rep)
            except struct.error:
                raise os_error(errno.EPIPE, "bad reply from the pyrds stack service") from None
            if code:
                _raise(code, None)
            self._snd_taken += n
            if n == 0:
                self._snd_empty_taken += 1
            if grant >= 0:
                self._post_dest, self._post_epoch = dest, grant
        return int(n)

    def _post(self, buffers: list[rpc.Buffer], flags: int, dest: Any, size: int) -> bool:
        """Send without waiting, under the grant for ``dest`` (service/posting.py); False when the grant is
        void or the send buffer may be full, in bytes or (an empty message) in empty messages in flight (the
        caller asks the stack, which answers exactly)."""
        with self._lock:
            page = self._page
            if dest != self._post_dest:
                return False
            if _PAGE_COUNT.unpack_from(page, rpc.PAGE_EPOCH_AT)[0] != self._post_epoch:
                return False
            sndbuf = _PAGE_COUNT.unpack_from(page, rpc.PAGE_SNDBUF_AT)[0]
            released = _PAGE_COUNT.unpack_from(page, rpc.PAGE_RELEASED_AT)[0]
            if size > sndbuf or self._snd_taken - released >= sndbuf:
                return False  # EMSGSIZE, or perhaps EAGAIN: the stack's own answer
            if size == 0:
                released_empty = _PAGE_COUNT.unpack_from(page, rpc.PAGE_EMPTY_RELEASED_AT)[0]
                if self._snd_empty_taken - released_empty >= sndbuf:
                    return False  # perhaps EAGAIN: the stack's own answer
            ctl = self._ctl
            if ctl is None:
                return False
            daddr, dport = dest if dest is not None else (b"", 0)
            head = _SEND_REQ.pack(rpc.TAG_POST, flags, 1, len(daddr), dport, 0)
            try:
                rpc.send_parts(ctl, [head, daddr, *buffers], self._limit)
            except OSError:
                raise os_error(errno.EPIPE, "the pyrds stack service went away") from None
            self._snd_taken += size
            if size == 0:
                self._snd_empty_taken += 1
        return True

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

    def _pushed(self, bufsize: int, flags: int, by_page: bool = True) -> tuple[bytes, Any, int, Any] | None:
        """One message from the data channel (None: it is empty). Not a peek: the service is told, and when
        the message was the tail of the queue and the channel is now empty, the readiness fd is emptied here
        (the service makes it true again if anything arrived meanwhile). ``by_page``: believe the page when
        it says the channel is empty (not after poll said it is readable: a service that died leaves a
        page that says so for good, and only the read finds the channel closed)."""
        if by_page and not self._page_unread()[1]:
            # every message the stack's queue took was read here or served by request (it counts one before
            # pushing it): the channel is empty, no read needed to find out
            return None
        peek = flags & _MSG_PEEK
        want = _HDR_SIZE + bufsize
        buf = _push_buffer(want)
        try:
            n = self._data.recv_into(buf, want, _MSG_DONTWAIT | peek)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            raise os_error(errno.EPIPE, "the pyrds stack service went away") from None
        if n < _HDR_SIZE:
            raise os_error(errno.EPIPE, "bad message from the pyrds stack service")
        dlen, port, scope, alen, pflags, raw = _PUSH_HDR.unpack_from(buf)
        data = bytes(buf[_HDR_SIZE:n])  # the kernel cut a longer message at our size
        mflags = _MSG_TRUNC if dlen > bufsize else 0
        src = _source(raw[:alen], port, scope)
        if not peek:
            self._pushed_read += 1
            self._read_charge += dlen + rpc.PAGE_SYNC_MSG_COST
            self._consumed(bool(pflags & _PUSH_TAIL), bool(pflags & _PUSH_BYTE_FOLLOWS))
        return data, [], mflags, src

    def _page_unread(self) -> tuple[int, int]:
        """From the shared page: the messages the stack's queue ever took, and how many of them were neither
        read here from the channel nor served by request (in the channel or still queued). Served is read
        first: the stack writes it first (publish_counts), so a half-updated pair can only overstate."""
        page = self._page
        served: int = _PAGE_COUNT.unpack_from(page, rpc.PAGE_SERVED_AT)[0]
        queued: int = _PAGE_COUNT.unpack_from(page, rpc.PAGE_QUEUED_AT)[0]
        return queued, queued - served - self._pushed_read

    def _drain_ready(self) -> int:
        """Take every byte the readiness fd holds now (one stream read walks its whole receive queue)."""
        total = 0
        try:
            while True:
                got = len(self._ready.recv(4096, _MSG_DONTWAIT))
                total += got
                if got != 4096:
                    break
        except OSError:
            pass
        self._ready_taken += total
        return total

    def _consumed(self, tail: bool, byte_follows: bool = False) -> None:
        """Count a read on the report page; tell the service at once only when the page asks (a synchronous
        report, or a notice while it holds messages the channel had no room for). ``byte_follows``: the
        service makes the (empty) readiness fd readable for this message just after the push
        (rpc.PUSH_BYTE_FOLLOWS): when emptying it finds nothing, that byte is still on its way and is waited
        for (at most :data:`_BYTE_WAIT_MS`), so that it does not arrive after this read as a POLLIN that no
        message stands behind."""
        drained = sync = False
        page = self._page
        if tail:
            # nothing else was readable when it was pushed; and, by the page's counts, every message the
            # stack's queue ever took was read here or served by request: nothing is in the channel or the
            # queue (the stack counts a message before it pushes it), so the socket is not readable now
            queued, unread = self._page_unread()
            if not unread:
                drained = True
                # the service waited for each byte's delivery before it pushed anything after it: only the
                # byte of this very push may be missing, and the push said so
                if not self._drain_ready() and byte_follows:
                    if self._poll(self._ready.fileno(), _BYTE_WAIT_MS):
                        self._drain_ready()
                # a message queued while we emptied the fd: the stack re-arms it before our recv returns
                sync = _PAGE_COUNT.unpack_from(page, rpc.PAGE_QUEUED_AT)[0] != queued
        _REPORT.pack_into(self._report, rpc.REPORT_READ_AT, self._pushed_read, self._ready_taken & _U64)
        if sync or (page[0] and self._read_charge >= _PAGE_COUNT.unpack_from(page, rpc.PAGE_SYNC_AT)[0]):
            # the read may change what other sockets see (a congested port uncongests, a held transport
            # reads again; the reads before the page's sync point cannot), or the fd must be made true again:
            # as the kernel's recvmsg, return only once the stack has taken it
            try:
                self._fast([_CONSUMED.pack(rpc.TAG_CONSUMED, 0, drained, 1, self._ready_taken & _U32)])
            except OSError:
                pass  # closed, or the service went away: the message is the caller's all the same
            return
        if not page[rpc.PAGE_NOTIFY_AT]:
            return  # the service takes it from the report page when it needs it
        with self._lock:
            ctl = self._ctl
            if ctl is None:
                return
            try:
                ctl.send(b"\0" + _CONSUMED.pack(rpc.TAG_CONSUMED, 0, drained, 0, self._ready_taken & _U32))
            except OSError:
                pass  # the service went away: the next request says so

    def _wait_cong(self) -> None:
        """A blocking send was told to wait for a congested port (rds_cong_wait): until the stack's send
        waker says a map changed or a local receiver drained below its cap (the stack registered this socket
        before it answered), at most :data:`_CONG_WAKE_CAP`. The first time, the waker is asked for and the
        send goes again at once (an update may have come before the waker existed)."""
        if self._waker < 0:
            if not self._waker_asked:
                self._waker_asked = True
                fds: list[int] = []
                try:
                    self._call(rpc.Op.SEND_WAKER, (), want_fds=1, fds_out=fds)
                except OSError:
                    pass  # a service without wakers (EINVAL), or out of descriptors: poll as before
                if fds:
                    self._waker = fds.pop(0)
                for fd in fds:
                    os.close(fd)
                if self._waker >= 0:
                    return
            time.sleep(_CONG_POLL)
            return
        if self._poll(self._waker, int(_CONG_WAKE_CAP * 1000)):
            try:
                while len(os.read(self._waker, 64)) == 64:
                    pass
            except OSError:
                pass

    @staticmethod
    def _poll(fd: int, timeout_ms: int) -> bool:
        p = select.poll()
        p.register(fd, _POLLIN)
        return bool(p.poll(timeout_ms))

    def _wait_input(self, deadline: float | None) -> bool | None:
        """poll() the data channel and the readiness fd for input: True when the channel has a message,
        False when only the readiness fd is readable (the stack holds input it did not push), None on
        timeout."""
        p = select.poll()
        p.register(self._fd, _POLLIN)
        data = self._data.fileno()
        p.register(data, _POLLIN)
        got = _poll_until(p, deadline)
        if got is None:
            return None
        for fd, _ev in got:
            if fd == data:
                return True
        return False

    def _wait(self, events: int, deadline: float | None) -> bool:
        """poll() the readiness fd (and, for input, the data channel); False on timeout."""
        p = select.poll()
        p.register(self._fd, events)
        if events & _POLLIN:
            p.register(self._data.fileno(), _POLLIN)
        return _poll_until(p, deadline) is not None

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
        if type(flags) is not int or not _INT_MIN <= flags <= _INT_MAX:
            flags = c_int(flags)
        dest = None if address is None else _pack_dest(address)
        bufs: list[rpc.Buffer] = [  # a list as is (the common case), else checked like the stdlib
            b if type(b) is bytes else readable_view(b)
            for b in (buffers if type(buffers) is list else send_buffers(buffers))
        ]
        anc = send_ancdata(ancdata) if ancdata else []
        # CPython's rules: no timeout -> the call blocks unless MSG_DONTWAIT; timeout 0 -> non-blocking;
        # timeout > 0 -> the fd is non-blocking for the kernel, CPython polls first and retries on EAGAIN.
        timed = bool(self._timeout)
        blocking = self._timeout is None and not flags & _MSG_DONTWAIT
        deadline = None if self._timeout is None else self._deadline()
        raw_anc = rpc.encode(anc) if anc else b""
        size = len(bufs[0]) if len(bufs) == 1 else sum(len(b) for b in bufs)  # one buffer: no generator
        oversize = size > RDS_MAX_MSG_SIZE
        if oversize:
            # more than any RDS message (EMSGSIZE), possibly more than a control record holds: the stack
            # gets the size instead of the bytes and answers with the kernel's error for it
            gdest = None if dest is None else (str(ipaddress.ip_address(dest[0])), dest[1])
            n: int = self._call(rpc.Op.SEND, (size, anc, flags, gdest, not blocking))
            return n
        if (
            not raw_anc
            and not flags & ~_MSG_DONTWAIT
            and self._post_epoch >= 0
            and self._post(bufs, flags, dest, size)
        ):
            return size
        if timed and not self._wait(select.POLLOUT, deadline):
            raise TimeoutError("timed out")
        waited = False
        while True:
            try:
                return self._send_once(bufs, raw_anc, flags, dest, not blocking, waited)
            except OSError as exc:
                if not (blocking or timed) or exc.errno not in (errno.EAGAIN, rpc.WAIT_CONG):
                    raise
                if exc.errno == errno.EAGAIN:
                    ok = self._wait(select.POLLOUT, deadline)
                else:  # congested destination: the kernel sleeps on the map's waitqueue
                    self._wait_cong()
                    waited = ok = True
                if not ok:
                    raise TimeoutError("timed out") from None

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        # plain ints in range (every call of a well-behaved program) skip the conversions' Python calls
        plain = type(bufsize) is int and type(flags) is int
        if not (plain and 0 <= bufsize <= _SSIZE_MAX and _INT_MIN <= flags <= _INT_MAX):
            bufsize, flags = _recv_args(bufsize, flags, "recv")
        return self.recvmsg(bufsize, 0, flags)[0]

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, SockAddr]:
        plain = type(bufsize) is int and type(flags) is int
        if not (plain and 0 <= bufsize <= _SSIZE_MAX and _INT_MIN <= flags <= _INT_MAX):
            bufsize, flags = _recv_args(bufsize, flags, "recvfrom")
        data, _anc, _flags, addr = self.recvmsg(bufsize, 0, flags)
        sender: SockAddr = addr
        return data, sender

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[bytes, AncData, int, Any]:
        if not (
            type(bufsize) is int
            and type(ancbufsize) is int
            and type(flags) is int
            and 0 <= bufsize <= _SSIZE_MAX
            and 0 <= ancbufsize <= _SSIZE_MAX
            and _INT_MIN <= flags <= _INT_MAX
        ):
            bufsize, ancbufsize, flags = c_ssize(bufsize), c_ssize(ancbufsize), c_int(flags)
        if bufsize < 0:
            raise ValueError("negative buffer size in recvmsg()")
        if ancbufsize < 0:
            raise ValueError("invalid ancillary data buffer length")
        timed = bool(self._timeout)
        blocking = self._timeout is None and not flags & _MSG_DONTWAIT
        deadline = None if self._timeout is None else self._deadline()
        fast = bufsize < 1 << 62 and ancbufsize < 1 << 62
        oob = flags & _MSG_OOB
        by_page = True
        while True:
            if self._ctl is None:
                raise os_error(errno.EBADF)
            if timed and oob:  # CPython polls before the call: nothing readable is a timeout
                if not self._wait(select.POLLIN, deadline):
                    raise TimeoutError("timed out")
            if not oob:
                got = self._pushed(min(bufsize, RDS_MAX_MSG_SIZE), flags, by_page)
                if got is not None:
                    return got
                by_page = True
                # nothing pushed: anything else readable shows on the readiness fd (the service keeps its
                # POLLIN true while it holds input); a non-blocking recv then fails with EAGAIN without a
                # round trip, a blocking one waits for either fd (one poll) before asking
                if not (blocking or timed):
                    if not self._readable():
                        raise os_error(errno.EAGAIN)
                elif self._ctl is not None:
                    ready = self._wait_input(deadline)
                    if ready is None:
                        raise TimeoutError("timed out")
                    if ready:
                        by_page = False
                        continue  # the data channel: read it
            try:
                if fast:
                    return self._recv_once(bufsize, ancbufsize, flags, not blocking)
                args = (bufsize, ancbufsize, flags, not blocking)
                data, anc, mflags, src = self._call(rpc.Op.RECV, args)
                anc = [tuple(a) for a in anc]
                if src is not None:
                    src = _source(ipaddress.ip_address(src[0]).packed, src[1], src[2])
                return data, anc, mflags, src
            except OSError as exc:
                if exc.errno == rpc.RETRY_PUSHED:
                    continue  # pushed since we looked: read those first
                if not (blocking or timed) or exc.errno != errno.EAGAIN:
                    raise
                if not self._wait(select.POLLIN, deadline):
                    raise TimeoutError("timed out") from None

    def _readable(self) -> bool:
        if self._ctl is None:
            return True  # the request fails with EBADF
        return self._poll(self._fd, 0)

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
            self._ready.close()
            self._data.close()
            self._page.close()
            self._report.close()
            if self._waker >= 0:
                os.close(self._waker)
                self._waker = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
