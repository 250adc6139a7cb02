"""The RDS/TCP transport (net/rds/tcp*.c): the listener on port 16385 and one
:class:`~pyrds.userspace.transports.tcp.conn.TcpConn` per (laddr, faddr), each with its paths.

What each part holds: :mod:`.conn` the dial rule, multipath and path pairing of one connection; :mod:`.path`
one TCP socket driven by the sans-IO :class:`~pyrds.userspace.proto.path.PathEngine`; :mod:`.sockopt` the
socket tuning and source-port helpers. This module is what the stack sees: the
:class:`~pyrds.userspace.stack.transport.Transport` interface.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Iterable, Sequence

from pyrds.addr import IPAddress
from pyrds.constants import RDS_FLAG_PROBE_PORT, InfoConnectionFlag
from pyrds.constants import Transport as TransportType
from pyrds.userspace.proto.path import PathState
from pyrds.userspace.stack.ports import normalize
from pyrds.userspace.stack.resources import FD_EXHAUSTED, SpareFd
from pyrds.userspace.stack.sockstate import Outgoing
from pyrds.userspace.stack.transport import (
    ConnectionRow,
    EventLoop,
    HashKey,
    MessageRow,
    StackHost,
    TcpSocketRow,
)
from pyrds.userspace.transports.tcp.conn import TcpConn
from pyrds.userspace.transports.tcp.path import R, TcpPath
from pyrds.userspace.transports.tcp.rxseq import RxSeqPage, open_page

__all__ = ["TcpTransport"]

log = logging.getLogger("pyrds.userspace.tcp")
#: the listener rests this long when not even the spare descriptor let it accept
ACCEPT_BACKOFF = 0.1


class TcpTransport:
    kind = TransportType.TCP
    prefer_loopback = True  # rds_tcp_transport.t_prefer_loopback
    immediate = False

    def __init__(self, host: StackHost, loop: EventLoop) -> None:
        self.host = host
        self.loop = loop
        self.conns: dict[tuple[IPAddress, IPAddress], TcpConn] = {}
        #: the last :meth:`conn`: its arguments and result (``conns`` only grows: it never goes stale)
        self._last_conn: tuple[IPAddress, IPAddress, TcpConn] | None = None
        self.listener: socket.socket | None = None
        self.closed = False
        self._spare: SpareFd | None = None
        #: between cork() and uncork(): the paths given messages, to kick once (insertion order)
        self._corked: dict[TcpPath, None] | None = None
        #: every path's next_rx_seq, kept for the next service after a kill (rxseq.py); opened once the
        #: listener is ours (a second service of the stack fails there and must not touch it)
        self.rx_page: RxSeqPage | None = None

    def start(self) -> None:
        """Dual-stack listener on [::]:PYRDS_TCP_PORT with SO_REUSEADDR (rds_tcp_listen_init)."""
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            s.bind(("::", self.host.config.tcp_port))
            s.listen(64)
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.listener = s
        self._spare = SpareFd()
        if self.rx_page is None:
            cfg = self.host.config
            self.rx_page = open_page(cfg.owner, cfg.served_name)
        self.loop.register(s, R, self._accept)

    def laddr_check(self, ip: IPAddress) -> bool:
        """rds_tcp_laddr_check: an address of this node (namespace)."""
        return self.host.is_local(ip)

    def conn(self, laddr: IPAddress, faddr: IPAddress) -> TcpConn:
        last = self._last_conn
        if last is not None and last[0] is laddr and last[1] is faddr:
            return last[2]  # the same address objects as the last call (every send of a socket to one peer)
        key = (normalize(laddr), normalize(faddr))
        c = self.conns.get(key)
        if c is None:
            c = self.conns[key] = TcpConn(
                self.host, self.loop, *key, stopped=lambda: self.closed, rx_page=self.rx_page
            )
        self._last_conn = (laddr, faddr, c)
        return c

    def _accept(self, _mask: int) -> None:
        assert self.listener is not None
        try:
            s, peer = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno not in FD_EXHAUSTED:
                raise
            self._shed(self.listener, exc.errno)
            return
        s.setblocking(False)
        try:
            faddr = normalize(ipaddress.ip_address(peer[0].split("%")[0]))
            laddr = normalize(ipaddress.ip_address(s.getsockname()[0].split("%")[0]))
        except (OSError, ValueError):
            s.close()
            return
        if laddr == faddr or self.host.is_local(faddr):
            self.host.counters["tcp_accept_refused"] += 1  # a peer address local to this node
            s.close()
            return
        c = self.conn(laddr, faddr)
        if c.owner:  # a doorbell: we own the connection, make sure we dial
            s.close()
            c.advance()
            return
        c.accept(s, int(peer[1]))

    def _shed(self, listener: socket.socket, code: int) -> None:
        """accept() failed for want of descriptors or memory: accept the peer with the spare descriptor and
        close it (it re-dials with backoff), or rest the listener a moment; never a readable listener left
        unserved, which spins the service."""
        self.host.counters["accept_emfile"] += 1
        if self._spare is not None and self._spare.shed(listener, lambda _s: None):
            log.warning("RDS/TCP: out of descriptors or memory (%s): refused a connection", os.strerror(code))
            return
        self.loop.unregister(listener)

        def again() -> None:
            if self.listener is listener:
                self.loop.register(listener, R, self._accept)

        self.loop.call_later(ACCEPT_BACKOFF, again)

    # -- the Transport interface
    def transmit(self, msg: Outgoing, hash_key: HashKey) -> None:
        c = self.conn(msg.saddr, msg.daddr)
        if msg.sport == 0 or msg.sport == RDS_FLAG_PROBE_PORT:
            path = c.paths[0]
        else:
            path = c.path_for(hash_key)
        corked = self._corked
        if corked is None:
            path.queue(msg)
        else:
            path.queue(msg, kick=False)
            corked[path] = None

    def cork(self) -> None:
        self._corked = {}

    def uncork(self) -> None:
        corked, self._corked = self._corked, None
        for path in corked or ():
            path.kick()

    def cong_map_changed(self, laddr: IPAddress) -> None:
        """rds_cong_queue_updates: the map goes out on path 0 and, unlike the kernel, on every other path
        with a live connection too. Every path carried the map as it was when it connected (the kernel sets
        c_map_queued on each path's connect), and the peer reads its paths independently: a connect-time map
        delayed on path k (a TCP retransmission under loss) can be applied after path 0's newer one, leaving
        the peer with a stale congested bit and its sender on ENOBUFS for good (seen with 7.3 under netem).
        With the newest map last on every path, whatever order the peer reads them in, it ends current."""
        for (la, _fa), c in self.conns.items():
            if la != laddr:
                continue
            for p in c.paths:
                if p.index == 0 or p.sock is not None:
                    p.engine.queue_cong_map()
                    p.flush()

    def cancel(self, msgs: Sequence[Outgoing]) -> None:
        """``rds_send_drop_to``: ``msgs`` grouped by the connection :meth:`transmit` gave them to, each group
        cancelled on every path of its connection (:meth:`TcpPath.cancel_many`; the path a message went to
        depends on the paths negotiated when it was sent)."""
        by_conn: dict[tuple[IPAddress, IPAddress], list[Outgoing]] = {}
        # by the address objects' ids first (alive while msgs is): hashing an address is a Python call
        by_ids: dict[tuple[int, int], list[Outgoing]] = {}
        for msg in msgs:
            ids = (id(msg.saddr), id(msg.daddr))
            batch = by_ids.get(ids)
            if batch is None:
                key = (normalize(msg.saddr), normalize(msg.daddr))
                batch = by_ids[ids] = by_conn.setdefault(key, [])
            batch.append(msg)
        for key, batch in by_conn.items():
            c = self.conns.get(key)
            if c is not None:
                for p in c.paths:
                    p.cancel_many(batch)

    def reset(self) -> None:
        """Drop every TCP path (like writing net.rds.tcp.rds_tcp_sndbuf), gracefully: what the peer sent
        before is still read; owners reconnect and retransmit."""
        for c in self.conns.values():
            for p in c.paths:
                p.begin_close()

    def busy(self) -> bool:
        return any(
            p.engine.queued_msgs or p.staged or p.sock is not None
            for c in self.conns.values()
            for p in c.paths
        )

    def close(self) -> None:
        self.closed = True
        for c in self.conns.values():
            c.close()
        if self.listener is not None:
            self.loop.unregister(self.listener)
            self.listener.close()
            self.listener = None
        if self._spare is not None:
            self._spare.release()
            self._spare = None
        if self.rx_page is not None:
            self.rx_page.close(remove=True)  # a clean exit: the kernel forgets next_rx_seq with its conns
            self.rx_page = None

    # -- info tables
    def info_connections(self) -> Iterable[ConnectionRow]:
        rows: list[ConnectionRow] = []
        for c in self.conns.values():
            p = c.paths[0]
            st = p.engine.state
            flags = (InfoConnectionFlag.CONNECTED if st == PathState.UP else 0) | (
                InfoConnectionFlag.CONNECTING if st == PathState.CONNECTING else 0
            )
            if p.outbuf:
                flags |= InfoConnectionFlag.SENDING
            engine = p.engine
            rows.append(
                ConnectionRow(engine.next_tx_seq, engine.next_rx_seq, c.laddr, c.faddr, "tcp", int(flags), 0)
            )
        return rows

    def info_messages(self, retransmit_only: bool) -> Iterable[MessageRow]:
        rows: list[MessageRow] = []
        for c in self.conns.values():
            for p in c.paths:
                src = p.engine.unacked if retransmit_only else p.engine.unsent + p.engine.unacked
                rows.extend(MessageRow(m.seq, m.length, c.laddr, c.faddr, m.sport, m.dport, 0) for m in src)
                if not retransmit_only:  # staged messages get the next sequence numbers in the engine
                    nxt = p.engine.next_tx_seq
                    rows.extend(
                        MessageRow(nxt + i, len(m.payload), c.laddr, c.faddr, m.sport, m.dport, 0)
                        for i, m in enumerate(p.staged)
                    )
        return rows

    def info_tcp_sockets(self) -> Iterable[TcpSocketRow]:
        rows: list[TcpSocketRow] = []
        for c in self.conns.values():
            for p in c.paths:
                if p.sock is None:
                    continue
                try:
                    la, lp = p.sock.getsockname()[:2]
                    pa, pp = p.sock.getpeername()[:2]
                except OSError:
                    continue
                f = p.engine.framer
                rows.append(
                    TcpSocketRow(
                        normalize(ipaddress.ip_address(la)),
                        lp,
                        normalize(ipaddress.ip_address(pa)),
                        pp,
                        f.hdr_rem,
                        f.data_rem,
                        p.engine.tx_bytes & 0xFFFFFFFF,
                        0,
                        0,
                    )
                )
        return rows
