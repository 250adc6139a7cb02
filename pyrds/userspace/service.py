"""The stack service: one per network namespace, a selectors event loop serving RDS sockets over AF_UNIX.

``python -m pyrds.userspace.service`` binds the abstract socket ``\\0pyrds-stack-v2`` (``PYRDS_STACK_NAME``
overrides it) and serves until it has been idle (no clients, no TCP connections with queued data) for
``PYRDS_IDLE_EXIT`` seconds (default 5; negative = forever). A second service in the same namespace loses the
bind race with EADDRINUSE and exits 0. :class:`Service` can also run embedded (e.g. in a thread) for tests.
"""

from __future__ import annotations

import errno
import heapq
import ipaddress
import itertools
import logging
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pyrds.addr import IPAddress
from pyrds.userspace import info_tables, rpc, sockopts
from pyrds.userspace.config import StackConfig, stack_address
from pyrds.userspace.readiness import Readiness
from pyrds.userspace.sockstate import Outgoing, SockState
from pyrds.userspace.stack import Stack, StackError

log = logging.getLogger("pyrds.userspace.service")
Callback = Callable[[int], None]


class _Control:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.asm = rpc.Reassembler()
        self.rs: SockState | None = None
        self.limit = rpc.tune(sock)


def _ip(s: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(s)


_packed_ips: dict[bytes, IPAddress] = {}
_str_packed: dict[str, bytes] = {}


def _ip_packed(raw: bytes) -> IPAddress:
    ip = _packed_ips.get(raw)
    if ip is None:
        if len(_packed_ips) > 1024:
            _packed_ips.clear()
        ip = _packed_ips[raw] = ipaddress.ip_address(raw)
    return ip


def _packed(host: str) -> bytes:
    raw = _str_packed.get(host)
    if raw is None:
        if len(_str_packed) > 1024:
            _str_packed.clear()
        raw = _str_packed[host] = ipaddress.ip_address(host).packed
    return raw


class _DeferTcp:
    """Stands in for the TCP transport while a SEND is dispatched: the message reaches the transport after the
    reply went out, so the client goes on while the service writes to TCP (the result never depends on the
    TCP write)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.queued: list[tuple[Outgoing, tuple[int, int]]] = []

    def send(self, msg: Outgoing, hash_key: tuple[int, int]) -> None:
        self.queued.append((msg, hash_key))

    def cong_map_changed(self, laddr: IPAddress) -> None:
        self.real.cong_map_changed(laddr)

    def cancel(self, msg: Outgoing) -> None:
        self.queued = [(m, k) for m, k in self.queued if m is not msg]
        self.real.cancel(msg)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class Service:
    def __init__(self, stack: Stack | None = None, config: StackConfig | None = None) -> None:
        self.stack = stack or Stack(config)
        self.config = self.stack.config
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._controls: dict[int, _Control] = {}
        self._stop = threading.Event()
        self._idle_since: float | None = time.monotonic()
        self.tcp: Any = None
        self._rbuf = memoryview(bytearray(rpc.MAX_PACKET + 1))

    # -- event loop plumbing shared with the transports
    def register(self, sock: socket.socket, events: int, cb: Callback) -> None:
        self.sel.register(sock, events, cb)

    def modify(self, sock: socket.socket, events: int, cb: Callback) -> None:
        self.sel.modify(sock, events, cb)

    def unregister(self, sock: socket.socket) -> None:
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def call_later(self, delay: float, cb: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), cb))

    # -- lifetime
    def bind(self) -> None:
        """Bind the abstract listener; OSError(EADDRINUSE) when another service already serves this netns."""
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            lsock.bind(stack_address(self.config.name))
        except OSError:
            lsock.close()
            raise
        lsock.listen(128)
        lsock.setblocking(False)
        self.listener = lsock
        self.register(lsock, selectors.EVENT_READ, self._accept)

    def start_tcp(self) -> None:
        from pyrds.userspace.conn_manager import ConnManager

        self.tcp = ConnManager(self.stack, self)
        self.stack.tcp = self.tcp
        self.tcp.listen()

    def stop(self) -> None:
        self._stop.set()

    def serve_forever(self) -> None:
        while not self._stop.is_set():
            timeout = 0.5
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - time.monotonic()))
            for key, mask in self.sel.select(timeout):
                try:
                    key.data(mask)
                except Exception:  # a bug in one handler must not kill the stack
                    log.exception("handler failed")
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, cb = heapq.heappop(self._timers)
                try:
                    cb()
                except Exception:
                    log.exception("timer failed")
            if self._idle_exit_due(now):
                break
        self.close()

    def _idle_exit_due(self, now: float) -> bool:
        if self.config.idle_exit < 0:
            return False
        busy = bool(self._controls) or (self.tcp is not None and self.tcp.busy())
        if busy:
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = now
        return now - self._idle_since >= self.config.idle_exit

    def close(self) -> None:
        for ctl in list(self._controls.values()):
            self._drop(ctl)
        if self.tcp is not None:
            self.tcp.close()
        if self.listener is not None:
            self.unregister(self.listener)
            self.listener.close()
            self.listener = None
        self.sel.close()

    # -- control connections
    def _accept(self, _mask: int) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        ctl = _Control(sock)
        self._controls[sock.fileno()] = ctl
        self.register(sock, selectors.EVENT_READ, lambda _m: self._on_control(ctl))

    def _drop(self, ctl: _Control) -> None:
        self._controls.pop(ctl.sock.fileno(), None)
        self.unregister(ctl.sock)
        if ctl.rs is not None:
            self.stack.close(ctl.rs)
            ctl.rs = None
        ctl.sock.close()

    def _on_control(self, ctl: _Control) -> None:
        buf = self._rbuf
        for _ in range(64):
            try:
                n = ctl.sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop(ctl)
                return
            if not n:
                self._drop(ctl)
                return
            try:
                record = ctl.asm.feed(buf[:n])
                if record is None:
                    continue
                self._handle(ctl, record)
                # one request at a time per control connection (the client waits for each reply): no
                # point in another recv that would only say EAGAIN
                return
            except (rpc.ConnectionClosed, struct.error, OSError) as exc:
                log.warning("dropping control connection: %s", exc)
                self._drop(ctl)
                return

    def _handle(self, ctl: _Control, record: rpc.Buffer) -> None:
        """One request: dispatch it, send the reply (errors as their errno, never a dropped connection)."""
        tag = record[0] if len(record) else -1
        if tag == rpc.TAG_SEND:
            self._fast_send(ctl, record)
            return
        if tag == rpc.TAG_RECV:
            self._fast_recv(ctl, record)
            return
        op, args = rpc.decode(record)
        fds: list[int] = []
        try:
            result = self._dispatch(ctl, op, args, fds)
            reply = (0, result)
        except Exception as exc:
            code, extra = _error(exc)
            reply = (code, extra)
        rpc.send_record(ctl.sock, rpc.encode(reply), fds, ctl.limit)

    def _fast_send(self, ctl: _Control, record: rpc.Buffer) -> None:
        view = memoryview(record)
        _tag, flags, nonblock, dlen, dport, alen = rpc.SEND_REQ.unpack_from(view)
        rs = ctl.rs
        st = self.stack
        defer = None
        try:
            off = rpc.SEND_REQ.size
            dest = (_ip_packed(bytes(view[off : off + dlen])), dport) if dlen else None
            off += dlen
            anc = rpc.decode(view[off : off + alen]) if alen else ()
            payload = bytes(view[off + alen :])  # the one copy: Outgoing keeps it (bytes(bytes) is free)
            if rs is None:
                raise StackError(errno.EBADF)
            if st.tcp is not None:
                defer = st.tcp = _DeferTcp(st.tcp)
            try:
                n = st.sendmsg(rs, payload, anc, flags, dest, bool(nonblock))
            finally:
                if defer is not None:
                    st.tcp = defer.real
            reply = rpc.SEND_REP.pack(0, n)
        except Exception as exc:
            reply = rpc.SEND_REP.pack(_error(exc)[0], 0)
        try:
            rpc.send_parts(ctl.sock, [reply], ctl.limit)
        finally:  # queued and accounted: it goes out even when the client is gone
            if defer is not None:
                for msg, key in defer.queued:
                    defer.real.send(msg, key)

    def _fast_recv(self, ctl: _Control, record: rpc.Buffer) -> None:
        _tag, bufsize, ancbufsize, flags, nonblock = rpc.RECV_REQ.unpack_from(record)
        try:
            if ctl.rs is None:
                raise StackError(errno.EBADF)
            data, anc, mflags, src = self.stack.recvmsg(ctl.rs, bufsize, ancbufsize, flags, bool(nonblock))
        except Exception as exc:
            rpc.send_parts(ctl.sock, [rpc.RECV_REP.pack(_error(exc)[0], 0, 0, 0, 0, 0)], ctl.limit)
            return
        raw_anc = rpc.encode(anc) if anc else b""
        addr = b""
        port = scope = 0
        if src is not None:
            addr = _packed(src[0])
            port, scope = src[1], src[2]
        head = rpc.RECV_REP.pack(0, mflags, port, scope, len(addr), len(raw_anc))
        rpc.send_parts(ctl.sock, [head, addr, raw_anc, data], ctl.limit)

    def _dispatch(self, ctl: _Control, op: int, args: Any, fds: list[int]) -> Any:
        st = self.stack
        if op == rpc.Op.OPEN:
            if ctl.rs is None:
                ctl.rs = st.open()
                ready = ctl.rs.readiness = Readiness()
                fds.append(ready.client_fd())
            return ctl.rs.sock_id
        if op == rpc.Op.SYSCTL_GET:
            return dict(self.config.sysctl)
        if op == rpc.Op.SYSCTL_SET:
            name, value = args
            if name not in self.config.sysctl:
                raise StackError(errno.ENOENT)
            self.config.set_sysctl(name, value)
            if name in ("rds_tcp_sndbuf", "rds_tcp_rcvbuf") and self.tcp is not None:
                self.tcp.reset_all()
            return None
        rs = ctl.rs
        if rs is None:
            raise StackError(errno.EBADF)
        if op == rpc.Op.SEND:
            payload, anc, flags, dest, nonblock = args
            d = (_ip(dest[0]), dest[1]) if dest is not None else None
            return st.sendmsg(rs, payload, anc, flags, d, nonblock)
        if op == rpc.Op.RECV:
            bufsize, ancbufsize, flags, nonblock = args
            return st.recvmsg(rs, bufsize, ancbufsize, flags, nonblock)
        if op == rpc.Op.BIND:
            host, port, scope = args
            st.bind(rs, _ip(host), port, scope)
            return rs.bound_port
        if op == rpc.Op.CONNECT:
            host, port, v6 = args
            st.connect(rs, _ip(host), port, v6)
            return None
        if op == rpc.Op.GETSOCKNAME:
            return (
                str(rs.bound_addr) if rs.bound_addr else None,
                rs.bound_port,
                rs.scope_id,
                str(rs.conn_addr) if rs.conn_addr else None,
            )
        if op == rpc.Op.GETPEERNAME:
            if rs.conn_addr is None:
                raise StackError(errno.ENOTCONN)
            return (str(rs.conn_addr), rs.conn_port, rs.scope_id)
        if op == rpc.Op.SETSOCKOPT:
            level, name, value = args
            sockopts.setsockopt(st, rs, level, name, value)
            return None
        if op == rpc.Op.GETSOCKOPT:
            level, name, buflen = args
            return sockopts.getsockopt(st, rs, level, name, buflen)
        if op == rpc.Op.INFO:
            (info_type,) = args
            raw, _each = info_tables.table_bytes(st, info_type, 1 << 30)
            return raw
        if op == rpc.Op.SET_TOS:
            sockopts.set_tos(rs, args[0])
            return None
        if op == rpc.Op.GET_TOS:
            return rs.tos
        raise StackError(errno.EINVAL)


def _error(exc: Exception) -> tuple[int, Any]:
    """A failed request's reply: (errno, optlen or None); unexpected exceptions are logged."""
    if isinstance(exc, StackError):
        return int(exc.code), rpc.plain(exc.args[1]) if len(exc.args) > 1 else None
    if isinstance(exc, OSError) and exc.errno:
        return int(exc.errno), None
    if isinstance(exc, (ValueError, TypeError, KeyError, OverflowError)):
        log.debug("request refused: %r", exc)
        return errno.EINVAL, None
    log.exception("request failed")
    return errno.EIO, None


def _tune_malloc() -> None:
    """Keep large receive buffers off mmap: every ``recv(256 KiB)`` of the TCP path allocates the bytes object
    above glibc's 128 KiB mmap threshold and shrinks it, which costs mmap + mremap + munmap and fresh page
    faults per read (a freed shrunk chunk never raises the dynamic threshold). glibc only; best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(8 << 20))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    _tune_malloc()
    logging.basicConfig(
        level=os.environ.get("PYRDS_LOG", "WARNING"),
        stream=sys.stderr,
        format="pyrds-stack[%(process)d] %(levelname)s %(message)s",
    )
    svc = Service()
    try:
        svc.bind()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return 0  # another service won the race: clients use it
        raise
    try:
        svc.start_tcp()
    except (OSError, ImportError) as exc:
        log.warning("RDS/TCP listener unavailable (%s): loop transport only", exc)
    svc.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
