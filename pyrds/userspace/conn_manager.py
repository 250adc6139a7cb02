"""RDS/TCP connections of one stack: listener, dial rule, reconnect with backoff, per-connection I/O and acks.

One :class:`TcpConn` per (laddr, faddr) carries path 0 (a :class:`PathEngine`). The numerically smaller
address owns (dials and re-dials) the connection; a dial from the larger side is a doorbell that is closed.
Acks come from TCP: bytes written minus SIOCOUTQ. A peer that sends garbage (ProtocolError) loses its TCP
connection and ``tcp_protocol_error`` is incremented; other connections are unaffected.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import selectors
import socket
import struct
import termios
import time
from typing import TYPE_CHECKING, Any

from pyrds.addr import IPAddress
from pyrds.constants import InfoConnectionFlag
from pyrds.userspace.ports import normalize
from pyrds.userspace.proto.backoff import ReconnectBackoff
from pyrds.userspace.proto.errors import ProtocolError
from pyrds.userspace.proto.events import CongMapReceived, DuplicateDropped, MessageReceived, PingReceived
from pyrds.userspace.proto.handshake import should_dial
from pyrds.userspace.proto.path import PathEngine, PathState
from pyrds.userspace.sockstate import Incoming, Outgoing

if TYPE_CHECKING:
    from pyrds.userspace.service import Service
    from pyrds.userspace.stack import Stack

log = logging.getLogger("pyrds.userspace.tcp")
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE
ACK_POLL = 0.005


class TcpConn:
    def __init__(self, mgr: ConnManager, laddr: IPAddress, faddr: IPAddress) -> None:
        self.mgr = mgr
        self.laddr, self.faddr = laddr, faddr
        cfg = mgr.stack.config.sysctl
        self.engine = PathEngine(
            laddr, faddr, 0, local_map=mgr.stack.cong.map_for(laddr), ping_enable=bool(cfg["ping_enable"])
        )
        self.backoff = ReconnectBackoff(
            max(1, cfg["reconnect_min_delay_ms"]), max(1, cfg["reconnect_max_delay_ms"])
        )
        self.sock: socket.socket | None = None
        self.outbuf = b""
        self.pending: dict[int, Outgoing] = {}
        self.owner = should_dial(laddr, faddr)
        self.reconnect_scheduled = False
        self.ack_scheduled = False

    # -- state
    @property
    def up(self) -> bool:
        return self.engine.state == PathState.UP

    def queue(self, msg: Outgoing) -> None:
        seq = self.engine.queue(msg.sport, msg.dport, msg.payload)
        msg.seq = seq
        if msg.sock_id:
            self.pending[seq] = msg
        if self.up:
            self.flush()
        elif self.owner:
            self.dial_soon(0.0)
        else:
            self.doorbell()

    # -- connecting
    def dial_soon(self, delay: float | None = None) -> None:
        if self.sock is not None or self.reconnect_scheduled:
            return
        if delay is None:
            delay = self.backoff.next_delay(time.monotonic())
        self.reconnect_scheduled = True
        self.mgr.svc.call_later(delay, self._dial)

    def _dial(self) -> None:
        self.reconnect_scheduled = False
        if self.sock is not None or self.mgr.closed:
            return
        fam = socket.AF_INET6 if self.faddr.version == 6 else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((str(self.laddr), 0))
            s.connect_ex((str(self.faddr), self.mgr.stack.config.tcp_peer_port))
        except OSError:
            s.close()
            self.dial_soon()
            return
        self.sock = s
        self.engine.connecting(time.monotonic())
        self.mgr.svc.register(s, _W, self._on_connect)

    def _on_connect(self, _mask: int) -> None:
        s = self.sock
        assert s is not None
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.lost()
            return
        self.established(s, registered=True)

    def doorbell(self) -> None:
        """The larger address asks the owner to connect: a dial it then closes at once."""
        fam = socket.AF_INET6 if self.faddr.version == 6 else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((str(self.laddr), 0))
            s.connect_ex((str(self.faddr), self.mgr.stack.config.tcp_peer_port))
        except OSError:
            pass
        self.mgr.svc.call_later(0.2, s.close)

    def established(self, s: socket.socket, registered: bool = False) -> None:
        self.sock = s
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        if registered:
            self.mgr.svc.modify(s, _R, self._on_io)
        else:
            self.mgr.svc.register(s, _R, self._on_io)
        self.outbuf = b""
        self.engine.connection_made(time.monotonic())
        self.backoff.reset()
        self.flush()

    def lost(self, protocol_error: bool = False) -> None:
        s = self.sock
        if s is not None:
            self.mgr.svc.unregister(s)
            s.close()
            self.sock = None
            self.mgr.stack.counters["conn_reset"] += 1
        self.outbuf = b""
        self.engine.connection_lost(time.monotonic())
        if self.owner and self.engine.queued_msgs:
            self.dial_soon()
        elif self.owner:
            self.dial_soon()

    # -- I/O
    def flush(self) -> None:
        s = self.sock
        if s is None or not self.up:
            return
        while True:
            if not self.outbuf:
                self.outbuf = self.engine.bytes_to_send(256 * 1024)
                if not self.outbuf:
                    break
            try:
                n = s.send(self.outbuf)
            except (BlockingIOError, InterruptedError):
                self.mgr.stack.counters["tcp_sndbuf_full"] += 1
                self.mgr.svc.modify(s, _R | _W, self._on_io)
                break
            except OSError:
                self.lost()
                return
            self.outbuf = self.outbuf[n:]
        if not self.outbuf:
            self.mgr.svc.modify(s, _R, self._on_io)
        self.check_acks()

    def check_acks(self) -> None:
        s = self.sock
        if s is None:
            return
        try:
            outq = struct.unpack("i", fcntl.ioctl(s.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return
        written = self.engine.tx_bytes - len(self.outbuf)
        for acked in self.engine.acked_through(max(0, written - outq)):
            msg = self.pending.pop(acked.seq, None)
            if msg is not None:
                self.mgr.stack.acked(msg)
        if self.pending and not self.ack_scheduled:
            self.ack_scheduled = True
            self.mgr.svc.call_later(ACK_POLL, self._ack_timer)

    def _ack_timer(self) -> None:
        self.ack_scheduled = False
        self.check_acks()

    def _on_io(self, mask: int) -> None:
        s = self.sock
        if s is None:
            return
        if mask & _W:
            self.mgr.stack.counters["tcp_write_space_calls"] += 1
            self.flush()
        if not mask & _R or self.sock is None:
            return
        self.mgr.stack.counters["tcp_data_ready_calls"] += 1
        try:
            data = s.recv(256 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.lost()
            return
        try:
            events = self.engine.feed(data, time.monotonic())
        except ProtocolError as exc:
            log.warning("RDS/TCP %s -> %s: %s; dropping the connection", self.faddr, self.laddr, exc)
            self.mgr.stack.counters["tcp_protocol_error"] += 1
            for ev in getattr(exc, "partial", None) or []:
                self._event(ev)
            self.lost(protocol_error=True)
            return
        for ev in events:
            self._event(ev)
        self.flush()  # pongs

    def _event(self, ev: Any) -> None:
        st = self.mgr.stack
        if isinstance(ev, MessageReceived):
            h = ev.header
            now = time.monotonic_ns()
            st.deliver(
                Incoming(
                    self.faddr,
                    self.laddr,
                    h.sport,
                    h.dport,
                    ev.payload,
                    h.sequence,
                    0,
                    lat=(now, now, now, 0),
                )
            )
        elif isinstance(ev, CongMapReceived):
            mask = st.cong.replace_remote(self.faddr, ev.map)
            st.cong.map_updated(mask, st.wake)
        elif isinstance(ev, PingReceived):
            st.counters["recv_ping"] += 1
            st.counters["send_pong"] += int(ev.pong_queued)
        elif isinstance(ev, DuplicateDropped):
            st.counters["recv_drop_old_seq"] += 1

    def close(self) -> None:
        if self.sock is not None:
            self.mgr.svc.unregister(self.sock)
            self.sock.close()
            self.sock = None


class ConnManager:
    def __init__(self, stack: Stack, svc: Service) -> None:
        self.stack = stack
        self.svc = svc
        self.conns: dict[tuple[IPAddress, IPAddress], TcpConn] = {}
        self.listener: socket.socket | None = None
        self.closed = False

    def listen(self) -> None:
        port = self.stack.config.tcp_port
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", port))
        s.listen(64)
        s.setblocking(False)
        self.listener = s
        self.svc.register(s, _R, self._accept)

    def conn(self, laddr: IPAddress, faddr: IPAddress) -> TcpConn:
        key = (normalize(laddr), normalize(faddr))
        c = self.conns.get(key)
        if c is None:
            c = self.conns[key] = TcpConn(self, *key)
        return c

    def _accept(self, _mask: int) -> None:
        assert self.listener is not None
        try:
            s, peer = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        s.setblocking(False)
        faddr = normalize(ipaddress.ip_address(peer[0].split("%")[0]))
        laddr = normalize(ipaddress.ip_address(s.getsockname()[0].split("%")[0]))
        if self.stack.is_local(faddr) or laddr == faddr:
            self.stack.counters["tcp_accept_refused"] += 1
            s.close()
            return
        c = self.conn(laddr, faddr)
        if c.owner:  # doorbell: we own the connection, make sure we dial
            s.close()
            if c.sock is None:
                c.dial_soon(0.0)
            return
        if c.sock is not None and c.up:
            self.stack.counters["tcp_connect_raced"] += 1
            s.close()
            return
        if c.sock is not None:
            c.lost()
        c.established(s)

    # -- TcpTransport protocol used by Stack
    def send(self, msg: Outgoing, sport_hash: int) -> None:
        self.conn(msg.saddr, msg.daddr).queue(msg)

    def cong_map_changed(self, laddr: IPAddress) -> None:
        for (la, _fa), c in self.conns.items():
            if la == laddr:
                c.engine.queue_cong_map()
                c.flush()

    def cancel(self, msg: Outgoing) -> None:
        for c in self.conns.values():
            if c.pending.get(msg.seq) is msg:
                del c.pending[msg.seq]

    def busy(self) -> bool:
        return any(c.engine.queued_msgs or c.sock is not None for c in self.conns.values())

    def close(self) -> None:
        self.closed = True
        for c in self.conns.values():
            c.close()
        if self.listener is not None:
            self.svc.unregister(self.listener)
            self.listener.close()
            self.listener = None

    # -- info
    def info_connections(self) -> list[tuple[int, int, IPAddress, IPAddress, str, int, int]]:
        rows: list[tuple[int, int, IPAddress, IPAddress, str, int, int]] = []
        for c in self.conns.values():
            st = c.engine.state
            flags = (InfoConnectionFlag.CONNECTED if st == PathState.UP else 0) | (
                InfoConnectionFlag.CONNECTING if st == PathState.CONNECTING else 0
            )
            rows.append((c.engine.next_tx_seq, c.engine.next_rx_seq, c.laddr, c.faddr, "tcp", int(flags), 0))
        return rows

    def info_messages(self, kind: str) -> list[tuple[int, int, IPAddress, IPAddress, int, int, int]]:
        rows: list[tuple[int, int, IPAddress, IPAddress, int, int, int]] = []
        for c in self.conns.values():
            src = c.engine.unsent + c.engine.unacked if kind == "send" else c.engine.unacked
            rows.extend((m.seq, m.length, c.laddr, c.faddr, m.sport, m.dport, 0) for m in src)
        return rows

    def info_tcp_sockets(self) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for c in self.conns.values():
            if c.sock is None:
                continue
            try:
                la, lp = c.sock.getsockname()[:2]
                pa, pp = c.sock.getpeername()[:2]
            except OSError:
                continue
            f = c.engine.framer
            rows.append(
                (
                    normalize(ipaddress.ip_address(la)),
                    lp,
                    normalize(ipaddress.ip_address(pa)),
                    pp,
                    f.hdr_rem,
                    f.data_rem,
                    c.engine.tx_bytes & 0xFFFFFFFF,
                    0,
                    0,
                )
            )
        return rows
