"""RDS/TCP connections of one stack: the listener, one :class:`TcpConn` per (laddr, faddr) with its paths,
the dial rule and multipath.

The numerically smaller address owns (dials and re-dials, with backoff) every path; a dial from the larger
side is a doorbell that the owner closes before dialling itself. Path 0 carries the multipath probe
(sport 1 -> dport 0 with NPATHS and SPORT_IDX), which the owner sends on every new path 0 connection (7.x:
the peer may have restarted and know nothing); once ``c_npaths`` is known the owner dials paths 1..n-1, one
at a time and in order.
A socket's messages use path ``jhash(port, initval) & (npaths - 1)``, path 0 until the handshake is done.
At fan-out (``c_npaths`` becomes > 1) paths > 0 wait until path 0 has no unacked message from before
(:meth:`PathEngine.begin_catchup`, 7.x ``mprds_catchup_tx0_retries``).

Path pairing and reconnects follow :mod:`pyrds.userspace.proto.pathset`: when the owner loses any path it
closes all of them gracefully and, once every path is down, re-dials 0, 1, ... in order (a 6.1 acceptor gives
a connection the first free path) from source ports with ``port % 8 == index``; the acceptor pairs
connections by ``port % npaths`` once the peer's probe/pong carried SPORT_IDX (7.x rule), before that a pyrds
dialer's by the index tag in the source port (a re-dialled path replaces its stale connection) and others by
the first free path.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import TYPE_CHECKING, Any

from pyrds.addr import IPAddress
from pyrds.constants import RDS_FLAG_PROBE_PORT, RDS_MPATH_WORKERS, InfoConnectionFlag
from pyrds.userspace.ports import normalize
from pyrds.userspace.proto.backoff import ReconnectBackoff
from pyrds.userspace.proto.handshake import jhash_1word, should_dial
from pyrds.userspace.proto.path import PathState
from pyrds.userspace.proto.pathset import accept_path, next_dial, pyrds_dialer_port
from pyrds.userspace.sockstate import Outgoing
from pyrds.userspace.tcp_transport import R, TcpPath

if TYPE_CHECKING:
    from pyrds.userspace.service import Service
    from pyrds.userspace.stack import Stack

SETTLE_DELAY = 0.05  # after a teardown, before re-dialling path 0: the peer's paths go DOWN after their FIN
ConnRow = tuple[int, int, IPAddress, IPAddress, str, int, int]
MsgRow = tuple[int, int, IPAddress, IPAddress, int, int, int]


class TcpConn:
    def __init__(self, mgr: ConnManager, laddr: IPAddress, faddr: IPAddress) -> None:
        self.mgr = mgr
        self.laddr, self.faddr = laddr, faddr
        self.owner = should_dial(laddr, faddr)
        cfg = mgr.stack.config.sysctl
        self.backoff = ReconnectBackoff(
            max(1, cfg["reconnect_min_delay_ms"]),
            max(1, cfg["reconnect_min_delay_ms"], cfg["reconnect_max_delay_ms"]),
        )
        self.npaths = 0
        self.with_sport_idx = False  # c_with_sport_idx: the peer's last probe/pong carried SPORT_IDX
        self.probe_sent = False
        self.redial_backoff = False  # a path was lost: the next dial of path 0 waits
        self.max_paths = RDS_MPATH_WORKERS  # 1 once a dialer that cannot pair paths (6.1) connected
        self.paths: list[TcpPath] = [TcpPath(self, 0)]

    def new_socket(self) -> socket.socket:
        fam = socket.AF_INET6 if self.faddr.version == 6 else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setblocking(False)
        return s

    def doorbell(self) -> None:
        """The larger address asks the owner to connect: a dial that is closed again right away."""
        s = self.new_socket()
        try:
            s.bind((str(self.laddr), 0))
            s.connect_ex((str(self.faddr), self.mgr.stack.config.tcp_peer_port))
        except OSError:
            pass
        self.mgr.svc.call_later(0.2, s.close)

    def path_for(self, hash_key: tuple[int, int]) -> TcpPath:
        """rds_send_mprds_hash."""
        port, initval = hash_key
        n = self.npaths or 8
        index = jhash_1word(port, initval) & (n - 1) if n & (n - 1) == 0 else jhash_1word(port, initval) % n
        if self.npaths == 0 and index != 0 and not self.probe_sent and self.paths[0].up:
            self.send_probe()
        if self.npaths <= 1 or index >= len(self.paths):
            return self.paths[0]
        return self.paths[index]

    def send_probe(self) -> None:
        self.probe_sent = True
        self.paths[0].engine.send_probe()
        self.paths[0].kick()

    def path0_up(self) -> None:
        """A new path 0 connection: the owner probes on every one (7.x ``rds_conn_shutdown`` queues a ping for
        the next connection: the peer may be a restarted instance that knows neither NPATHS nor SPORT_IDX)."""
        if self.owner:
            self.send_probe()

    def negotiated(self, npaths: int, sport_idx: bool = False) -> None:
        """``rds_recv_hs_exthdrs``: ``c_npaths`` and ``c_with_sport_idx`` from a probe ping/pong. A peer that
        speaks SPORT_IDX names its paths by port, so the single-path limit for 6.1 dialers does not apply to
        it. At fan-out path 0 starts the catch-up, and an acceptor drops a path 0 that came from another path
        of the peer (7.x ``rds_tcp_fan_out_w``)."""
        self.with_sport_idx = sport_idx
        new = min(npaths, RDS_MPATH_WORKERS if sport_idx else self.max_paths)
        p0 = self.paths[0]
        fan_out = new > 1 and new != self.npaths
        if fan_out:
            p0.engine.begin_catchup(len(p0.staged))
        self.npaths = new
        while len(self.paths) < npaths:
            self.paths.append(TcpPath(self, len(self.paths)))
        if sport_idx and 0 < p0.engine.last_advertised < RDS_MPATH_WORKERS:
            self.send_probe()  # we told this peer fewer paths before we knew it speaks SPORT_IDX
        if (
            fan_out
            and sport_idx
            and not self.owner
            and p0.sock is not None
            and p0.peer_port is not None
            and p0.peer_port % new != 0
        ):
            p0.begin_close()
        self.advance()

    def peer_restarted(self, path: TcpPath) -> None:
        """GEN_NUM changed (``rds_conn_peer_gen_update``): every path restarts its sequence numbers and drops
        its retransmit queue (``path``'s engine already did)."""
        for p in self.paths:
            if p is not path:
                p.release(p.engine.reset_sequences())

    def advance(self) -> None:
        """Owner: dial the next path (:func:`next_dial`), path 0 after a backoff if a path was lost."""
        if not self.owner or self.mgr.closed:
            return
        index = next_dial([p.lane for p in self.paths], self.npaths)
        if index is None or index >= len(self.paths) or self.paths[index].dial_scheduled:
            return
        delay = 0.0
        if index == 0 and self.redial_backoff:
            self.redial_backoff = False
            delay = max(SETTLE_DELAY, self.backoff.next_delay(time.monotonic()))
        self.paths[index].dial_soon(delay)

    def path_confirmed(self, path: TcpPath) -> None:
        if all(p.confirmed for p in self.paths[: max(1, self.npaths)]):
            self.backoff.reset()
        self.advance()

    def path_down(self, path: TcpPath) -> None:
        """Owner: a path is gone, so close every other path too and re-dial all of them in order."""
        if not self.owner or self.mgr.closed:
            return
        self.redial_backoff = True
        for p in self.paths:
            if p is not path:
                p.begin_close()
        self.advance()

    def accept(self, s: socket.socket, peer_port: int) -> None:
        """An incoming connection for this (laddr, faddr) on the non-owner side (:func:`accept_path`): by
        ``peer_port % npaths`` once the peer speaks SPORT_IDX, else by the 6.1-compatible rules."""
        if self.with_sport_idx:
            usable = self.paths[: max(1, self.npaths)]
            choice = accept_path(peer_port, [p.sock is not None for p in usable], sport_idx=True)
            assert choice is not None
            index, replace = choice
            if replace:
                usable[index].take_over(s)
            else:
                usable[index].established(s)
            return
        tagged = pyrds_dialer_port(peer_port, self.npaths, peer_is_61=self.max_paths == 1)
        if tagged is None and self.npaths <= 1 and self.max_paths > 1:
            # A 6.1 dialer re-dials its paths in parallel from random ports: nothing tells them apart, so
            # a reset would cross their sequence spaces. Answer its probes with NPATHS=1: one path.
            self.max_paths = 1
            for p in self.paths:
                p.engine.advertise_npaths = 1
        usable = self.paths[: max(1, self.npaths)]
        choice = accept_path(tagged, [p.sock is not None for p in usable])
        if choice is None:
            self.mgr.stack.counters["tcp_connect_raced"] += 1
            s.close()
            return
        index, replace = choice
        if replace:
            usable[index].take_over(s)
        else:
            usable[index].established(s)

    def close(self) -> None:
        for p in self.paths:
            p.close()


class ConnManager:
    def __init__(self, stack: Stack, svc: Service) -> None:
        self.stack = stack
        self.svc = svc
        self.conns: dict[tuple[IPAddress, IPAddress], TcpConn] = {}
        self.listener: socket.socket | None = None
        self.closed = False

    def listen(self) -> None:
        """Dual-stack listener on [::]:PYRDS_TCP_PORT with SO_REUSEADDR (rds_tcp_listen_init)."""
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            s.bind(("::", self.stack.config.tcp_port))
            s.listen(64)
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.listener = s
        self.svc.register(s, R, self._accept)

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
        try:
            faddr = normalize(ipaddress.ip_address(peer[0].split("%")[0]))
            laddr = normalize(ipaddress.ip_address(s.getsockname()[0].split("%")[0]))
        except (OSError, ValueError):
            s.close()
            return
        if laddr == faddr or self.stack.is_local(faddr):
            self.stack.counters["tcp_accept_refused"] += 1  # a peer address local to this node
            s.close()
            return
        c = self.conn(laddr, faddr)
        if c.owner:  # a doorbell: we own the connection, make sure we dial
            s.close()
            c.advance()
            return
        c.accept(s, int(peer[1]))

    # -- what Stack calls (TcpTransport protocol)
    def send(self, msg: Outgoing, hash_key: tuple[int, int]) -> None:
        c = self.conn(msg.saddr, msg.daddr)
        if msg.sport == 0 or msg.sport == RDS_FLAG_PROBE_PORT:
            c.paths[0].queue(msg)
        else:
            c.path_for(hash_key).queue(msg)

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

    def cancel(self, msg: Outgoing) -> None:
        for c in self.conns.values():
            for p in c.paths:
                p.cancel(msg)

    def reset_all(self) -> None:
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
            self.svc.unregister(self.listener)
            self.listener.close()
            self.listener = None

    # -- info tables
    def info_connections(self) -> list[ConnRow]:
        rows: list[ConnRow] = []
        for c in self.conns.values():
            p = c.paths[0]
            st = p.engine.state
            flags = (InfoConnectionFlag.CONNECTED if st == PathState.UP else 0) | (
                InfoConnectionFlag.CONNECTING if st == PathState.CONNECTING else 0
            )
            if p.outbuf:
                flags |= InfoConnectionFlag.SENDING
            rows.append((p.engine.next_tx_seq, p.engine.next_rx_seq, c.laddr, c.faddr, "tcp", int(flags), 0))
        return rows

    def info_messages(self, kind: str) -> list[MsgRow]:
        rows: list[MsgRow] = []
        for c in self.conns.values():
            for p in c.paths:
                src = p.engine.unsent + p.engine.unacked if kind == "send" else p.engine.unacked
                rows.extend((m.seq, m.length, c.laddr, c.faddr, m.sport, m.dport, 0) for m in src)
                if kind == "send":  # staged messages get the next sequence numbers when handed to the engine
                    nxt = p.engine.next_tx_seq
                    rows.extend(
                        (nxt + i, len(m.payload), c.laddr, c.faddr, m.sport, m.dport, 0)
                        for i, m in enumerate(p.staged)
                    )
        return rows

    def info_tcp_sockets(self) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
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
                    (
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
