"""The stack service: one per network namespace, serving RDS sockets over AF_UNIX control connections.

It binds the abstract socket ``\\0pyrds-stack-v8`` (``PYRDS_STACK_NAME`` overrides it) and serves until it
has been idle (no clients, no established RDS/TCP connection) for ``PYRDS_IDLE_EXIT`` seconds (default 5;
negative = forever). The data path (binary SEND/RECV records) is served here; every other operation goes
through the table in :mod:`pyrds.userspace.service.handlers`. :class:`Service` can also run embedded (e.g. in
a thread) for tests: ``bind()``, ``start_tcp()``, ``serve_forever()``, ``stop()``.

Trust (:mod:`.trust`): a root service serves the shared name to every uid; a service of another uid serves
``<name>-uid<N>`` (:attr:`StackConfig.served_name`) and closes, unread, every connection whose SO_PEERCRED
uid is not its own. Each connection keeps its peer's credentials for the privilege checks of the handlers.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import os
import select
import selectors
import socket
import struct
import threading
import time

from pyrds.addr import IPAddress
from pyrds.constants import InfoConnectionFlag
from pyrds.constants import Transport as TransportType
from pyrds.userspace import rpc
from pyrds.userspace.config import PeerCred, StackConfig, peer_cred, stack_address
from pyrds.userspace.service.eventloop import SelectorLoop
from pyrds.userspace.service.handlers import Request, dispatch
from pyrds.userspace.service.posting import take_post
from pyrds.userspace.service.readiness import confirm_all
from pyrds.userspace.service.replies import error_reply
from pyrds.userspace.service.trust import may_connect
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.outbox import Outbox
from pyrds.userspace.stack.resources import FD_EXHAUSTED, SpareFd
from pyrds.userspace.stack.sockstate import SockState
from pyrds.userspace.transports import ib_transport, loop_transport, rdma_available, tcp_transport

__all__ = ["Service"]

log = logging.getLogger("pyrds.userspace.service")
#: the control listener rests this long when not even the spare descriptor let it accept
ACCEPT_BACKOFF = 0.1


class _Control:
    """One control connection: its socket, record reassembly and the RDS socket it serves (after OPEN)."""

    def __init__(self, sock: socket.socket, peer: PeerCred) -> None:
        self.sock = sock
        self.peer = peer
        self.asm = rpc.Reassembler()
        self.rs: SockState | None = None
        self.limit = rpc.tune(sock)
        #: the event loop pass that last read this connection (:meth:`Service._read_control`)
        self.read_pass = -2


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


class Service:
    def __init__(self, stack: Stack | None = None, config: StackConfig | None = None) -> None:
        self.stack = stack or Stack(config)
        self.config = self.stack.config
        self.loop = SelectorLoop()
        self.listener: socket.socket | None = None
        self._controls: dict[int, _Control] = {}
        self._stop = threading.Event()
        self._idle_since: float | None = time.monotonic()
        self.started = time.time()
        self._rbuf = memoryview(bytearray(rpc.MAX_PACKET + 1))
        self._spare = SpareFd()  # accept-and-refuse at EMFILE (resources.SpareFd)
        self._settling = False
        self.stack.attach(loop_transport(self.stack))

    # -- lifetime
    def bind(self) -> None:
        """Bind the abstract listener (the shared name, or the owner's private one); OSError(EADDRINUSE) when
        another service already serves it, EPERM for a shared stack when we are not root."""
        if self.config.owner is None and os.geteuid() != 0:
            raise PermissionError(errno.EPERM, "only root serves the shared pyrds stack (use a private one)")
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            lsock.bind(stack_address(self.config.served_name))
        except OSError:
            lsock.close()
            raise
        lsock.listen(128)
        lsock.setblocking(False)
        self.listener = lsock
        self.loop.register(lsock, selectors.EVENT_READ, self._accept)

    def start_tcp(self) -> None:
        """Attach the RDS/TCP transport and start its listener (OSError: the transport still dials out)."""
        tcp = tcp_transport(self.stack, self.loop)
        self.stack.attach(tcp)
        tcp.start()

    def start_ib(self) -> bool:
        """Attach the RDS/IB transport when it can exist here: the initial network namespace (as the kernel's
        rds_rdma), an RDMA device, and pyverbs (imported now: ImportError without it). False: not attached."""
        if not self.config.initial_netns or not rdma_available():
            return False
        ib = ib_transport(self.stack, self.loop)
        ib.start()
        self.stack.attach(ib)
        return True

    def stop(self) -> None:
        self._stop.set()

    def _status(self) -> dict[str, float | int]:
        """STATUS's service figures: start time and client connections (not the one asking)."""
        return {"started": self.started, "clients": max(0, len(self._controls) - 1)}

    def serve_forever(self) -> None:
        stop, run_once = self._stop, self.loop.run_once
        while not stop.is_set():
            now = run_once(0.5)
            if self._controls:  # _idle_exit_due's first answer, inline (a client is connected)
                self._idle_since = None
            elif self._idle_exit_due(now):
                break
        self.close()

    def _idle_exit_due(self, now: float) -> bool:
        if self.config.idle_exit < 0:
            return False
        if self._controls or self._peers_connected():
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = now
        return now - self._idle_since >= self.config.idle_exit

    def _peers_connected(self) -> bool:
        """With no client socket left, only an established connection keeps the stack: RDS/TCP (a TCP socket
        with a peer: a peer talks to us, or is still reading what we sent) or RDS/IB (a connection UP).
        Dials pending or retried toward unreachable peers, and the messages of closed sockets waiting for
        them, do not: they are dropped when the service exits, as the kernel frees a closed socket's queued
        messages."""
        for transport in self.stack.transports:
            if not transport.busy():
                continue
            if any(True for _ in transport.info_tcp_sockets()):
                return True
            if transport.kind == TransportType.IB and any(
                row.flags & InfoConnectionFlag.CONNECTED for row in transport.info_connections()
            ):
                return True
        return False

    def close(self) -> None:
        for ctl in list(self._controls.values()):
            self._drop(ctl)
        for transport in self.stack.transports:
            transport.close()
        if self.listener is not None:
            self.loop.unregister(self.listener)
            self.listener.close()
            self.listener = None
        self._spare.release()
        self.loop.close()

    # -- control connections
    def _accept(self, _mask: int) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno not in FD_EXHAUSTED:
                raise
            self._shed(self.listener, exc.errno)
            return
        try:
            peer = peer_cred(sock)
        except OSError:
            sock.close()
            return
        if not may_connect(peer, self.config.owner):
            log.warning(
                "refused uid %d (pid %d) on uid %s's private stack", peer.uid, peer.pid, self.config.owner
            )
            sock.close()
            return
        sock.setblocking(False)
        ctl = _Control(sock, peer)
        self._controls[sock.fileno()] = ctl
        self.loop.register(sock, selectors.EVENT_READ, functools.partial(self._on_control, ctl))

    def _shed(self, listener: socket.socket, code: int) -> None:
        """accept() failed with EMFILE/ENFILE/ENOMEM/ENOBUFS: take the connection with the spare descriptor
        and answer its first request with that errno before closing it (the client's socket() raises it),
        instead of leaving it in the backlog while the listener stays readable (a spin, and a client that
        waits forever). When even that fails, stop polling the listener for ACCEPT_BACKOFF seconds."""
        self.stack.counters["accept_emfile"] += 1
        refusal = bytes([rpc.LAST]) + rpc.encode((code, None))

        def refuse(sock: socket.socket) -> None:
            sock.send(refusal, socket.MSG_DONTWAIT)

        if self._spare.shed(listener, refuse):
            log.warning("out of descriptors or memory (%s): refused a control connection", os.strerror(code))
            return
        log.warning(
            "out of descriptors or memory (%s): not accepting for %.1f s", os.strerror(code), ACCEPT_BACKOFF
        )
        self.loop.unregister(listener)

        def again() -> None:
            if self.listener is listener:
                self.loop.register(listener, selectors.EVENT_READ, self._accept)

        self.loop.call_later(ACCEPT_BACKOFF, again)

    def _drop(self, ctl: _Control) -> None:
        self._controls.pop(ctl.sock.fileno(), None)
        self.loop.unregister(ctl.sock)
        if ctl.rs is not None:
            self.stack.close(ctl.rs)
            ctl.rs = None
        ctl.sock.close()

    def _on_control(self, ctl: _Control, _mask: int = 0, drain: bool = False) -> None:
        """The connection is readable (``drain``: read every notice it holds now, see :meth:`_settle`)."""
        posts = Outbox()  # POST notices read in a row: their messages written together
        try:
            self._read_control(ctl, posts, drain)
        finally:
            posts.flush(self.stack.transmit_failed)
        rs = ctl.rs
        if rs is not None and rs.pushed:
            # the reads its report page shows, now that its sends are on their way (request/response: the
            # read before this send is taken while the message crosses the network, not before it leaves)
            self.stack.pull_reads(rs)

    def _read_control(self, ctl: _Control, posts: Outbox, drain: bool = False) -> None:
        """Read and serve the connection's records: up to 64 notices in a row, or one request. A lone POST
        notice ends the read when the connection was not read in the last pass of the event loop either
        (request/response: nothing follows it, and a read to find that out is one system call per message;
        epoll reports the connection again if something did); notices coming in a row, or ``drain``, are
        read until none is left, so their messages go out together."""
        buf = self._rbuf
        passes = self.loop.passes
        in_a_row = drain or ctl.read_pass >= passes - 1
        ctl.read_pass = passes
        for _ in range(64):
            try:
                n = ctl.sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                self.stack.counters["control_reads_empty"] += 1
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
                tag = record[0] if len(record) else -1
                if tag == rpc.TAG_POST:
                    self._posted(ctl, record, posts)  # a notice too
                    if not in_a_row:
                        return
                    continue
                posts.flush(self.stack.transmit_failed)  # before what follows them (a send's own message)
                if tag == rpc.TAG_CONSUMED:
                    self._consumed(ctl, record)  # a notice: a request may follow it at once
                    if record[-1]:
                        return  # answered: the client waits, nothing follows
                    continue
                if ctl.rs is not None and ctl.rs.pushed:
                    self.stack.pull_reads(ctl.rs)  # its reads before this request count
                self._handle(ctl, record)
                # one request at a time per control connection (the client waits for each reply): no
                # point in another recv that would only say EAGAIN
                return
            except (rpc.ConnectionClosed, struct.error, OSError) as exc:
                log.warning("dropping control connection: %s", exc)
                self._drop(ctl)
                return
            except Exception:  # a bug: this client only loses its connection (EPIPE), never waits forever
                log.exception("dropping control connection after an unexpected error")
                self._drop(ctl)
                return

    def _consumed(self, ctl: _Control, record: rpc.Buffer) -> None:
        """A CONSUMED notice (answered only when it asks: the client's recv then waits for it). A malformed
        one, or one claiming more than was pushed, drops this connection (struct.error / OSError reach
        :meth:`_on_control`): only the client that sent it loses."""
        taken: int | None = None
        if len(record) == rpc.CONSUMED_V1.size:
            _tag, count, drained, reply = rpc.CONSUMED_V1.unpack(record)
        else:
            _tag, count, drained, reply, taken = rpc.CONSUMED.unpack(record)
        if ctl.rs is None:
            raise OSError(errno.EBADF, "CONSUMED before OPEN")
        if not count:  # the reads are on the client's report page
            self.stack.pull_reads(ctl.rs)
        else:
            try:
                self.stack.consume(ctl.rs, count, bool(drained), taken)
            except StackError as exc:
                raise OSError(exc.code, "CONSUMED more than was pushed") from None
        if reply:
            confirm_all()
            rpc.send_parts(ctl.sock, [rpc.SEND_REP.pack(0, count, -1)], ctl.limit)

    def _posted(self, ctl: _Control, record: rpc.Buffer, outbox: Outbox) -> None:
        """A POST notice (service/posting.py). One that is malformed, or comes before OPEN, drops this
        connection (struct.error / OSError reach :meth:`_on_control`)."""
        view = memoryview(record)
        _tag, flags, _mode, dlen, dport, alen = rpc.SEND_REQ.unpack_from(view)
        if ctl.rs is None or alen or ctl.rs.grant_epoch < 0:
            raise OSError(errno.EPROTO, "POST before OPEN, before any grant, or with ancillary data")
        off = rpc.SEND_REQ.size
        try:
            dest = (_ip_packed(bytes(view[off : off + dlen])), dport) if dlen else None
        except ValueError:
            raise OSError(errno.EPROTO, "POST with a malformed address") from None
        take_post(self.stack, ctl.rs, bytes(view[off + dlen :]), flags, dest, outbox)

    def _settle(self, asking: _Control) -> None:
        """Before a request that reads stack-wide state (info tables, counters, options), or a send: take
        the CONSUMED and POST notices other clients already sent, so what they read or sent shows (their
        recv or send returned before this request was made; the kernel's accounting is done by then)."""
        if self._settling:
            return
        self._settling = True
        try:
            for other in self._controls.values():  # the reads clients counted on their report pages
                if other.rs is not None and other.rs.pushed:
                    self.stack.pull_reads(other.rs)
            # only connections that may hold notices, and of those only the readable ones: one poll()
            # for all of them rather than a recv each
            poller: select.poll | None = None
            for fd, other in self._controls.items():
                rs = other.rs
                if other is not asking and rs is not None and (rs.pushed or rs.grant_epoch >= 0):
                    if poller is None:
                        poller = select.poll()
                    poller.register(fd, select.POLLIN)
            if poller is None:
                return
            for fd, _ev in poller.poll(0):
                ready = self._controls.get(fd)
                if ready is not None:
                    self._on_control(ready, drain=True)
        finally:
            self._settling = False

    def _handle(self, ctl: _Control, record: rpc.Buffer) -> None:
        """One request: dispatch it, send the reply (errors as their errno, never a dropped connection)."""
        tag = record[0] if len(record) else -1
        if tag == rpc.TAG_SEND:
            self._fast_send(ctl, record)
            return
        if tag == rpc.TAG_RECV:
            self._fast_recv(ctl, record)
            return
        request = rpc.decode(record)  # ConnectionClosed (malformed): the caller drops this connection only
        self._settle(ctl)
        req = Request(self.stack, ctl.rs, peer=ctl.peer, stop=self.stop, service_status=self._status)
        self.stack.hold_pushes()
        try:
            if not (isinstance(request, tuple) and len(request) == 2 and type(request[0]) is int):
                raise StackError(errno.EINVAL)  # well-formed values, but not (op, args)
            op, args = request
            reply = (0, dispatch(req, op, args))
        except Exception as exc:
            reply = error_reply(exc)
        ctl.rs = req.rs  # OPEN made the connection's socket
        try:
            raw = rpc.encode(reply)
        except (TypeError, ValueError, OverflowError) as exc:  # a result with no plain-value form: a bug here
            log.error("unencodable reply to op %r: %s", request, exc)
            raw = rpc.encode((errno.EIO, None))
        try:
            confirm_all()
            rpc.send_record(ctl.sock, raw, req.fds, ctl.limit)
        finally:
            self.stack.release_pushes()
            for done in req.after_reply:
                done()

    def _fast_send(self, ctl: _Control, record: rpc.Buffer) -> None:
        view = memoryview(record)
        _tag, flags, mode, dlen, dport, alen = rpc.SEND_REQ.unpack_from(view)
        rs = ctl.rs
        outbox = Outbox()
        try:
            off = rpc.SEND_REQ.size
            dest = (_ip_packed(bytes(view[off : off + dlen])), dport) if dlen else None
            off += dlen
            if mode & ~(rpc.SEND_NONBLOCK | rpc.SEND_WAITED):
                raise StackError(errno.EINVAL)
            anc = rpc.decode(view[off : off + alen]) if alen else ()
            payload = bytes(view[off + alen :])  # the one copy: Outgoing keeps it (bytes(bytes) is free)
            self._settle(ctl)  # a local receiver's reads count before its port's congestion is tested
            if rs is None:
                raise StackError(errno.EBADF)
            self.stack.hold_pushes()
            n = self.stack.sendmsg(
                rs,
                payload,
                anc,
                flags,
                dest,
                bool(mode & rpc.SEND_NONBLOCK),
                outbox,
                waited=bool(mode & rpc.SEND_WAITED),
            )
            grant = -1 if anc or flags & ~socket.MSG_DONTWAIT else self.stack.grant_posts(rs, dest)
            reply = rpc.SEND_REP.pack(0, n, grant)
        except Exception as exc:
            reply = rpc.SEND_REP.pack(error_reply(exc)[0], 0, -1)
        try:
            confirm_all()
            rpc.send_parts(ctl.sock, [reply], ctl.limit)
        finally:  # queued and accounted: it goes out even when the client is gone; never raises
            self.stack.release_pushes()
            outbox.flush(self.stack.transmit_failed)

    def _fast_recv(self, ctl: _Control, record: rpc.Buffer) -> None:
        _tag, bufsize, ancbufsize, flags, nonblock = rpc.RECV_REQ.unpack_from(record)
        try:
            if ctl.rs is None:
                raise StackError(errno.EBADF)
            data, anc, mflags, src = self.stack.recvmsg(ctl.rs, bufsize, ancbufsize, flags, bool(nonblock))
            raw_anc = rpc.encode(anc) if anc else b""
            addr = b""
            port = scope = 0
            if src is not None:
                addr = _packed(src[0])
                port, scope = src[1], src[2]
            head = rpc.RECV_REP.pack(0, mflags, port, scope, len(addr), len(raw_anc))
        except Exception as exc:
            confirm_all()
            rpc.send_parts(ctl.sock, [rpc.RECV_REP.pack(error_reply(exc)[0], 0, 0, 0, 0, 0)], ctl.limit)
            return
        confirm_all()
        rpc.send_parts(ctl.sock, [head, addr, raw_anc, data], ctl.limit)
