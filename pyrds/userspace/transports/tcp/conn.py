"""One RDS/TCP connection (``struct rds_connection``): a (laddr, faddr) pair, its paths, the dial rule and
multipath.

The numerically smaller address owns (dials and re-dials, with backoff) every path; a dial from the larger
side is a doorbell that the owner closes before dialling itself. Path 0 carries the multipath probe
(sport 1 -> dport 0 with NPATHS and SPORT_IDX), which the owner sends on every new path 0 connection (7.x:
the peer may have restarted and know nothing); once ``c_npaths`` is known the owner dials paths 1..n-1, one
at a time and in order.
A socket's messages use path ``RDS_MPATH_HASH`` (:func:`~pyrds.userspace.proto.handshake.send_path_index`),
path 0 until the handshake is done.
At fan-out (``c_npaths`` becomes > 1) paths > 0 wait until path 0 has no unacked message from before
(:meth:`PathEngine.begin_catchup`, 7.x ``mprds_catchup_tx0_retries``).

Path pairing and reconnects follow :mod:`pyrds.userspace.proto.pathset`: when the owner loses a path other
than 0 while path 0 is confirmed and the peer pairs connections by source port (SPORT_IDX, and it answered our
probe on the current path 0), that path alone is dialled again, after its own backoff, and the others keep
their connections, as every kernel does (each ``rds_conn_path`` shuts down and reconnects on its own; a
dial waits SETTLE_DELAY, so that the loss of every path, a restarting peer, is still seen as one). Losing
path 0 (where the probe, and a peer's restart, show), or a path of any other peer, the owner closes all
paths gracefully and, once every path is down, re-dials 0, 1, ... in order (a 6.1 acceptor gives
a connection the first free path) from source ports with ``port % 8 == index``; the acceptor pairs
connections by ``port % npaths`` once the peer's probe/pong carried SPORT_IDX (7.x rule), before that a pyrds
dialer's by the index tag in the source port and others by the first free path. A connection whose path still
has one never replaces it (no kernel does): it waits, unread, until that path is down (docs/userspace.md,
"Who may replace a path").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from pyrds.addr import IPAddress
from pyrds.constants import RDS_MPATH_WORKERS
from pyrds.userspace.proto.backoff import ReconnectBackoff
from pyrds.userspace.proto.handshake import send_path_index, should_dial
from pyrds.userspace.proto.pathset import accept_path, fan_out_dials, next_dial, pyrds_dialer_port
from pyrds.userspace.stack.transport import EventLoop, HashKey, StackHost
from pyrds.userspace.transports.tcp.path import TcpPath
from pyrds.userspace.transports.tcp.rxseq import RxSeqPage

__all__ = ["Stopped", "TcpConn"]

log = logging.getLogger("pyrds.userspace.tcp")

#: tells a connection whether its transport was closed
Stopped = Callable[[], bool]

SETTLE_DELAY = 0.05  # after a teardown, before re-dialling path 0: the peer's paths go DOWN after their FIN
#: incoming connections held (unread) for paths that are still busy; more are refused (a full backlog)
MAX_WAITING = RDS_MPATH_WORKERS
#: a waiting connection is judged this long after it arrived (the busy path's keepalive probe has been
#: answered by then): refused if the path's own connection proved alive
PROOF_DELAY = 2.0
#: a waiting connection takes the place of its path's own when that one has heard nothing from the peer
#: for this long (and not since the newcomer arrived) while it waits for an ack or a keepalive answer
SILENCE_LIMIT = 2 * PROOF_DELAY
TCP_ESTABLISHED = 1
#: struct tcp_info up to tcpi_last_ack_recv: the eight u8 fields (tcpi_state, ca_state, retransmits, probes,
#: backoff, options, wscale, flags), then tcpi_rto .. tcpi_last_ack_recv (13 x u32)
_TCP_INFO = struct.Struct("=8B13I")


@dataclasses.dataclass(eq=False)
class Waiting:
    """An accepted connection waiting (unread) for its path to be free."""

    sock: socket.socket
    peer_port: int
    index: int  # the path it waits for
    gen: int  # that path's connection generation when it began to wait for it
    since: float  # monotonic time of that


class TcpConn:
    def __init__(
        self,
        host: StackHost,
        loop: EventLoop,
        laddr: IPAddress,
        faddr: IPAddress,
        stopped: Stopped,
        rx_page: RxSeqPage | None = None,
    ) -> None:
        self.host = host
        self.loop = loop
        self._stopped = stopped
        #: where its paths keep next_rx_seq across a restart of the service (None: ACK before push)
        self.rx_page = rx_page
        self.laddr, self.faddr = laddr, faddr
        self.owner = should_dial(laddr, faddr)
        cfg = host.config.sysctl
        lo = max(1, cfg["reconnect_min_delay_ms"])
        hi = max(lo, cfg["reconnect_max_delay_ms"])
        #: per path (``cp_reconnect_jiffies``): path 0's also paces the re-dial after a close of every path
        self.backoffs = [ReconnectBackoff(lo, hi) for _ in range(RDS_MPATH_WORKERS)]
        self.npaths = 0
        self.with_sport_idx = False  # c_with_sport_idx: the peer's last probe/pong carried SPORT_IDX
        #: owner: a pong answered our probe on the current path 0 connection (the peer has read the probe,
        #: and with it our SPORT_IDX): with ``with_sport_idx`` the other paths are dialled all at once
        self.probe_answered = False
        self.probe_sent = False
        #: paths whose next dial waits their backoff (they were lost); path 0 after a close of every path
        self.redial_waits: set[int] = set()
        self.max_paths = RDS_MPATH_WORKERS  # 1 once a dialer that cannot pair paths (6.1) connected
        self.paths: list[TcpPath] = [TcpPath(self, 0)]
        #: acceptor: connections for a path that was busy when they arrived, with their peer ports
        self.waiting: deque[Waiting] = deque()
        if not self.owner:
            self._resume_pairing()

    def _resume_pairing(self) -> None:
        """A restarted acceptor: the pairing the last service negotiated with this peer, if it named its paths
        by source port (rxseq.py): each connection of the owner's re-dial then finds its own path, and that
        path's receive sequence, before the owner's probe gets through."""
        npaths, sport_idx = self.paths[0].kept_pairing()
        if not sport_idx or not 1 < npaths <= RDS_MPATH_WORKERS:
            return
        self.with_sport_idx = True
        self.npaths = npaths
        while len(self.paths) < npaths:
            self.paths.append(TcpPath(self, len(self.paths)))

    @property
    def closed(self) -> bool:
        """The transport was closed: nothing is dialled any more."""
        return self._stopped()

    def new_socket(self) -> socket.socket:
        fam = socket.AF_INET6 if self.faddr.version == 6 else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setblocking(False)
        return s

    def doorbell(self) -> None:
        """The larger address asks the owner to connect: a dial that is closed again right away."""
        try:
            s = self.new_socket()
        except OSError:  # out of descriptors: the next send or the owner's own dial tries again
            return
        try:
            s.bind((str(self.laddr), 0))
            s.connect_ex((str(self.faddr), self.host.config.tcp_peer_port))
        except OSError:
            pass
        self.loop.call_later(0.2, s.close)

    def path_for(self, hash_key: HashKey) -> TcpPath:
        """rds_send_mprds_hash."""
        port, initval = hash_key
        index = send_path_index(port, self.npaths, initval)
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
            self.probe_answered = False
            self.send_probe()

    def pong_received(self) -> None:
        """A pong on path 0: the peer read our probe (TCP keeps path 0 in order), so it knows our SPORT_IDX
        before it sees a dial of any other path."""
        self.probe_answered = True

    def negotiated(self, npaths: int, sport_idx: bool = False) -> None:
        """``rds_recv_hs_exthdrs``: ``c_npaths`` and ``c_with_sport_idx`` from a probe ping/pong. A peer that
        speaks SPORT_IDX names its paths by port, so the single-path limit for 6.1 dialers does not apply to
        it. At fan-out path 0 starts the catch-up, and an acceptor drops a path 0 that came from another path
        of the peer (7.x ``rds_tcp_fan_out_w``)."""
        self.with_sport_idx = sport_idx
        new = min(npaths, RDS_MPATH_WORKERS if sport_idx else self.max_paths)
        p0 = self.paths[0]
        p0.keep_pairing(npaths, sport_idx)
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
        if not self.owner:
            self.admit_waiting()
        self.advance()

    def peer_restarted(self, path: TcpPath) -> None:
        """GEN_NUM changed (``rds_conn_peer_gen_update``): every path restarts its sequence numbers and drops
        its retransmit queue (``path``'s engine already did)."""
        for p in self.paths:
            if p is not path:
                p.release(p.engine.reset_sequences())

    @property
    def pairs_by_port(self) -> bool:
        """Owner: the peer gives each connection the path its source port names (its last probe/pong carried
        SPORT_IDX) and knows that ours do (it answered our probe on the current path 0)."""
        return self.with_sport_idx and self.probe_answered

    def advance(self) -> None:
        """Owner: dial the next path (:func:`next_dial`), a lost one after its backoff; to a peer that pairs
        by port, every down path at once (:func:`fan_out_dials`)."""
        if not self.owner or self.closed:
            return
        for index in self.dials_now():
            if index >= len(self.paths) or self.paths[index].dial_scheduled:
                continue
            delay = 0.0
            if index in self.redial_waits:
                self.redial_waits.discard(index)
                # after a close of every path: the peer's paths go DOWN after their FIN; after one path's
                # loss: a restarting peer's path 0 goes too, and then path 0 is dialled first (dials_now)
                delay = max(SETTLE_DELAY, self.backoffs[index].next_delay(time.monotonic()))
            self.paths[index].dial_soon(delay)

    def dials_now(self) -> list[int]:
        """Owner: the paths to dial now. To a peer that pairs by port every down path at once
        (:func:`fan_out_dials`), else one at a time, in order (:func:`next_dial`; a 6.1 acceptor). A dial
        scheduled earlier asks again when its time comes (:meth:`TcpPath._dial`)."""
        lanes = [p.lane for p in self.paths]
        if self.pairs_by_port:
            return fan_out_dials(lanes, self.npaths)
        index = next_dial(lanes, self.npaths)
        return [] if index is None else [index]

    def path_confirmed(self, path: TcpPath) -> None:
        """A path's connection was accepted: its backoff starts again (``rds_connect_path_complete``); path
        0's, which paces the re-dial of every path, once all of them are."""
        if path.index != 0:
            self.backoffs[path.index].reset()
        if all(p.confirmed for p in self.paths[: max(1, self.npaths)]):
            self.backoffs[0].reset()
        self.advance()

    def path_down(self, path: TcpPath) -> None:
        """Owner: a path is gone. A path other than 0, path 0 confirmed, to a peer that pairs by port
        (:attr:`pairs_by_port`): that path alone is dialled again. Else every other path is closed too and
        all are re-dialled in order. Acceptor: a connection waiting for this path may take it now."""
        if self.closed:
            return
        if not self.owner:
            self.admit_waiting()
            return
        if path.index != 0 and self.pairs_by_port and self.paths[0].confirmed:
            self.redial_waits.add(path.index)
            self.advance()
            return
        self.redial_waits = {0}
        for p in self.paths:
            if p is not path:
                p.begin_close()
        self.advance()

    def accept(self, s: socket.socket, peer_port: int) -> None:
        """An incoming connection for this (laddr, faddr) on the non-owner side (:func:`accept_path`): by
        ``peer_port % npaths`` once the peer speaks SPORT_IDX, else by the 6.1-compatible rules.

        Like every kernel (``rds_tcp_accept_one_path`` only takes a path in RDS_CONN_DOWN), a connection
        never replaces a path that still has one: it waits, unread, until that path is down (7.x stashes it
        the same way), so nothing the peer's TCP saw acked on it is lost, while a stray or forged connection
        from the peer's host cannot take a live path over. The busy path's keepalive probe is made at once
        (:func:`_probe_liveness`): a connection the peer lost is reset and frees the path. If instead the
        peer's TCP shows the old connection alive after the newcomer arrived (:func:`_alive`) while the
        pairing was known (handshake done), the peer's stack did not re-dial that path (every RDS/TCP dialer
        closes a path's connection before dialling it again): the newcomer is refused, as 6.1 refuses
        it at once (``tcp_accept_refused_live``).

        Before any handshake, path 0 first reads what it already received: a pyrds or 7.x owner writes its
        probe on path 0 before it dials path 1, but a service that was slow to accept path 0 (one that had
        just started, after a restart) can find both ready at once; pairing path 1 first would take it for a
        6.1 dialer's (one path, NPATHS=1 answered) and the owner would tear everything down and re-dial."""
        p0 = self.paths[0]
        if not self.with_sport_idx and self.npaths == 0 and p0.sock is not None and not p0.closing:
            p0.read_pending()
        choice = self._choose(peer_port, learn=True)
        if choice is None:
            self.host.counters["tcp_connect_raced"] += 1
            s.close()
            return
        index, busy = choice
        if not busy:
            self.paths[index].established(s)
            return
        if len(self.waiting) >= MAX_WAITING:
            self.host.counters["tcp_connect_raced"] += 1
            s.close()
            return
        self.host.counters["tcp_accept_deferred"] += 1
        path = self.paths[index]
        entry = Waiting(s, peer_port, index, path.gen, time.monotonic())
        self.waiting.append(entry)
        _probe_liveness(path)
        if self.npaths > 0:
            self.loop.call_later(PROOF_DELAY, lambda: self._judge(entry))

    def _judge(self, entry: Waiting) -> None:
        """``entry`` has waited PROOF_DELAY for a path that is still busy: refuse it if the path's own
        connection proved alive since it arrived; ask again later if that is not clear yet."""
        if entry not in self.waiting or self.closed:
            return
        choice = self._choose(entry.peer_port, learn=False)
        if choice is not None and not choice[1]:
            self.admit_waiting()  # its path is free now
            return
        index = entry.index if choice is None else choice[0]
        path = self.paths[index]
        if path.sock is None:
            return
        moved = (index, path.gen) != (entry.index, entry.gen)
        info = None if moved or path.closing else _tcp_info(path.sock)  # one TCP_INFO read per judgment
        window = time.monotonic() - entry.since
        if moved:  # another connection has the path: judge that one
            entry.index, entry.gen, entry.since = index, path.gen, time.monotonic()
            _probe_liveness(path)
        elif info is not None and _silent(info, window):
            # Every RDS/TCP dialer closes a path's connection before dialling it again: the peer gave this
            # one up, and its close (a FIN or reset) was lost. TCP would only give up after tcp_retries2
            # (minutes with data outstanding, where no keepalive probe is made); meanwhile the re-dial,
            # and what the peer sends on it, would wait.
            self.host.counters["tcp_path_silent_dropped"] += 1
            log.info(
                "RDS/TCP %s -> %s path %d: its connection heard nothing from the peer, which dialled the path"
                " again from port %d: dropped for that one",
                self.faddr,
                self.laddr,
                index,
                entry.peer_port,
            )
            path.abandon()  # reads what it holds, closes; path_down -> admit_waiting gives the path away
            if entry in self.waiting:
                self.loop.call_later(PROOF_DELAY, lambda: self._judge(entry))
            return
        elif info is not None and _alive(info, window):
            self.waiting.remove(entry)
            self.host.counters["tcp_accept_refused_live"] += 1
            log.info(
                "RDS/TCP %s -> %s path %d: refused a connection from port %d, the path's own is alive",
                self.faddr,
                self.laddr,
                entry.index,
                entry.peer_port,
            )
            entry.sock.close()
            return
        self.loop.call_later(PROOF_DELAY, lambda: self._judge(entry))

    def _choose(self, peer_port: int, learn: bool) -> tuple[int, bool] | None:
        """:func:`accept_path` for a connection from ``peer_port``: (path, that path is busy) or None.
        ``learn``: a new arrival, which may reveal a 6.1 dialer (a waiting one is only judged again)."""
        if self.with_sport_idx:
            usable = self.paths[: max(1, self.npaths)]
            return accept_path(peer_port, [p.sock is not None for p in usable], sport_idx=True)
        tagged = pyrds_dialer_port(peer_port, self.npaths, peer_is_61=self.max_paths == 1)
        if learn and tagged is None and self.npaths <= 1 and self.max_paths > 1:
            # A 6.1 dialer re-dials its paths in parallel from random ports: nothing tells them apart, so
            # a reset would cross their sequence spaces. Answer its probes with NPATHS=1: one path.
            self.max_paths = 1
            for p in self.paths:
                p.engine.advertise_npaths = 1
        usable = self.paths[: max(1, self.npaths)]
        return accept_path(tagged, [p.sock is not None for p in usable])

    def admit_waiting(self) -> None:
        """A path went down or the handshake changed the pairing (7.x ``rds_tcp_conn_slots_available``):
        connections waiting for a free path get it, oldest first."""
        placed = True
        while placed and self.waiting and not self.closed:
            placed = False
            for i, entry in enumerate(self.waiting):
                choice = self._choose(entry.peer_port, learn=False)
                if choice is None or choice[1]:
                    continue
                del self.waiting[i]
                self.paths[choice[0]].established(entry.sock)
                placed = True
                break

    def close(self) -> None:
        for p in self.paths:
            p.close()
        while self.waiting:
            self.waiting.popleft().sock.close()


def _probe_liveness(path: TcpPath) -> None:
    """A connection waits for ``path``: make its keepalive probe now if it has received nothing for a
    second (TCP_KEEPIDLE 1 restarts the keepalive timer). A peer that lost the connection (a restart, a
    lost RST) answers with a reset, the path goes down and the waiting connection gets it; a live one acks
    and keeps the path. Invisible to RDS; the next connection of the path is tuned afresh."""
    if path.sock is None or path.closing:
        return
    with contextlib.suppress(OSError):
        path.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)


class _TcpInfo(NamedTuple):
    """The fields of ``struct tcp_info`` that :func:`_alive` and :func:`_silent` judge by."""

    state: int
    probes: int  # tcpi_probes: keepalive or zero-window probes unanswered
    unacked: int  # tcpi_unacked: segments sent and not acked
    heard_ms: int  # ms since the last data or ack from the peer (min of tcpi_last_data_recv, _last_ack_recv)


def _tcp_info(s: socket.socket) -> _TcpInfo | None:
    """``s``'s TCP_INFO, or None when it cannot be read or is shorter than :data:`_TCP_INFO`."""
    try:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    except OSError:
        return None
    if len(info) < _TCP_INFO.size:
        return None
    f = [int(v) for v in _TCP_INFO.unpack(info)]
    state, probes, unacked, last_data_recv, last_ack_recv = f[0], f[3], f[12], f[19], f[20]
    return _TcpInfo(state, probes, unacked, min(last_data_recv, last_ack_recv))


def _alive(info: _TcpInfo, window: float) -> bool:
    """The peer's TCP still holds the connection open (``info`` from :func:`_tcp_info`): no FIN from it
    (ESTABLISHED), no keepalive probe unanswered, and an ack or data from it within the last ``window``
    seconds."""
    return info.state == TCP_ESTABLISHED and info.probes == 0 and info.heard_ms < window * 1000


def _silent(info: _TcpInfo, window: float) -> bool:
    """The peer's TCP stopped answering on the connection (``info`` from :func:`_tcp_info`): data or a
    keepalive probe is unanswered (``tcpi_unacked``, ``tcpi_probes``) and nothing came from the peer for
    :data:`SILENCE_LIMIT` seconds, nor since the newcomer arrived ``window`` seconds ago."""
    waiting = info.unacked > 0 or info.probes > 0
    return info.state == TCP_ESTABLISHED and waiting and info.heard_ms >= max(window, SILENCE_LIMIT) * 1000
