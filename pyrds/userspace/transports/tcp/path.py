"""One RDS/TCP path: a TCP socket driven by a sans-IO :class:`PathEngine` (connect, I/O, acks, errors).

Acks come from TCP itself: bytes the socket accepted minus SIOCOUTQ (``ioctl(TIOCOUTQ)``) are acked by the
peer. A peer that sends garbage (ProtocolError) loses its TCP connection and ``tcp_protocol_error`` is
incremented.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol, assert_never, cast

from pyrds.addr import IPAddress
from pyrds.userspace.proto.errors import ProtocolError
from pyrds.userspace.proto.events import (
    AckedMessage,
    CongMapDropped,
    CongMapReceived,
    DuplicateDropped,
    Event,
    MessageReceived,
    NpathsNegotiated,
    PeerGenChanged,
    PingReceived,
    PongReceived,
)
from pyrds.userspace.proto.path import PathEngine, PathState
from pyrds.userspace.proto.pathset import OWNER_PREAMBLE, Lane
from pyrds.userspace.stack.counters import count_receive_event
from pyrds.userspace.stack.sockstate import Incoming, Outgoing, ReadAck
from pyrds.userspace.stack.transport import EventLoop, StackHost
from pyrds.userspace.transports.tcp.rxseq import RxSeqPage
from pyrds.userspace.transports.tcp.sockopt import (
    ack_now,
    advertised_mss,
    bind_path_port,
    segments_out,
    tune,
    unacked_bytes,
    unread_bytes,
)

__all__ = ["PathOwner", "R", "TcpPath", "W"]

log = logging.getLogger("pyrds.userspace.tcp")
R, W = selectors.EVENT_READ, selectors.EVENT_WRITE
_UP = PathState.UP
ACK_POLL = 0.005
#: how often a path with unacked messages asks TCP when no sender waits for them (every read and write of
#: the path asks anyway): a timer per message at ACK_POLL woke an otherwise idle service once per message
#: whenever a round trip took longer than ACK_POLL (a TCG guest: ~0.7 wakeups per round trip per service)
ACK_POLL_IDLE = 0.05
#: the newest unacked messages :meth:`TcpPath._ack_poll` asks about (StackHost.acks_awaited)
ACK_LOOK = 4
CONFIRM_POLL = 0.01  # owner: how often an unconfirmed connection checks whether its preamble was acked
CONFIRM_TIMEOUT = 5.0  # owner: send on a new connection after this even if nothing confirmed it
CLOSE_TIMEOUT = 5.0  # graceful close: give up waiting for the peer's FIN
WRITE_CHUNK = 256 * 1024
#: with a receive-sequence page: how far ahead of the next number a path reserves its send sequence there
#: (one store per this many messages; a restarted service skips at most this many numbers)
TX_RESERVE = 4096
#: reads after the first that :func:`_acked_read` makes at most to get the receive queue empty for the ACK
ACK_READS = 4
#: reads not known acked that a path remembers at most (an acked read then lets their messages be pushed); the
#: messages of older ones are served by request. Sockets it remembers to push to at most (others push at their
#: next delivery or read)
MAX_ACK_WAITS = 64
MAX_ACK_SOCKS = 64
#: pongs a path holds unacked at most (a peer that pings without reading the pongs): more pings go unanswered
PONG_MAX = 8192


class PathOwner(Protocol):
    """What a path needs from its connection (:class:`~pyrds.userspace.transports.tcp.conn.TcpConn`)."""

    host: StackHost
    loop: EventLoop
    laddr: IPAddress
    faddr: IPAddress
    owner: bool
    rx_page: RxSeqPage | None

    @property
    def paths(self) -> Sequence[TcpPath]: ...
    @property
    def closed(self) -> bool: ...

    def new_socket(self) -> socket.socket: ...
    def doorbell(self) -> None: ...
    def advance(self) -> None: ...
    def dials_now(self) -> list[int]: ...
    def path0_up(self) -> None: ...
    def pong_received(self) -> None: ...
    def path_confirmed(self, path: TcpPath) -> None: ...
    def path_down(self, path: TcpPath) -> None: ...
    def negotiated(self, npaths: int, sport_idx: bool = False) -> None: ...
    def peer_restarted(self, path: TcpPath) -> None: ...


class TcpPath:
    """One path of a :class:`TcpConn`: its PathEngine (sequence state, kept across reconnects) and the
    current TCP socket.

    Closing is graceful whenever the stream is still sound (a reset, a send error, the peer's FIN): FIN, then
    read and deliver until the peer's FIN (or :data:`CLOSE_TIMEOUT`), because everything the peer's TCP saw
    acked is freed by the peer and must not be thrown away unread. On the owner side a new connection carries
    no data until it is confirmed: the peer sent anything on it (its congestion map), TCP acked the
    :data:`OWNER_PREAMBLE` written first, or CONFIRM_TIMEOUT passed; only then is the next path dialled (see
    :mod:`pyrds.userspace.proto.pathset`)."""

    def __init__(self, conn: PathOwner, index: int) -> None:
        self.conn = conn
        self.host = conn.host
        self.loop = conn.loop
        self.index = index
        self.engine: PathEngine = PathEngine(
            conn.laddr,
            conn.faddr,
            index,
            local_map=conn.host.local_cong_map(conn.laddr),
            ping_enable=bool(conn.host.config.sysctl["ping_enable"]),
            max_pongs=PONG_MAX,
            lane0=conn.paths[0].engine if index > 0 else None,
        )
        #: the page that keeps this path's next_rx_seq across a restart (rxseq.py) and its offset there (None:
        #: no page, or no slot in it): with it a message may reach a reader once stored; without it, once
        #: our TCP's ACK for it is out
        self._rx_page: RxSeqPage | None = None
        self._rx_at = 0
        #: with a page: the send sequence reserved there, above every number this path has written
        self._tx_reserved = 0
        page = conn.rx_page
        at = page.slot(conn.laddr, conn.faddr, index) if page is not None else None
        if page is not None and at is not None:
            self._rx_page, self._rx_at = page, at
            self.engine.resume_rx(page.resume(at))
            reserved = page.tx_reserved(at)
            self.engine.resume_tx(reserved)
            # a value the engine refused (out of bounds) is replaced at the first write
            self._tx_reserved = reserved if self.engine.next_tx_seq == reserved else 0
        self.sock: socket.socket | None = None
        self.peer_port: int | None = None  # the TCP peer's port of the current connection
        self.dial_port: int | None = None  # owner: our source port of the last dial (a re-dial avoids it)
        #: what the engine handed out and TCP has not taken yet, in order (the first one possibly a view of
        #: the rest of a buffer TCP took in part)
        self.outbuf: list[bytes | memoryview] = []
        self.wire_bytes = 0  # bytes the TCP socket accepted on this connection
        #: of those, the ones the last SIOCOUTQ showed acked (:meth:`check_acks`)
        self.acked_wire = 0
        self.pending: dict[int, Outgoing] = {}
        self.dial_scheduled = False
        #: when the ack timer that is out will run (None: none is out)
        self._ack_timer_at: float | None = None
        #: owner: the peer accepted the current connection (the one fact of a path's life the engine's
        #: PathState does not hold; see :attr:`lane`)
        self.confirmed = False
        self.gen = 0  # connection generation: stale timers compare it
        #: the last read ended with the ACK for all of it sent (:func:`_acked_read`): its messages may go out
        self._read_acked = False
        #: the current connection's advertised MSS (TCP_INFO; 0: unknown), for :func:`_acked_read`
        self._advmss = 0
        #: the last read when it was not known acked (its messages carry it as ``read_ack``); None after an
        #: acked read
        self._read_ack: ReadAck | None = None
        #: the reads of the current connection not known acked yet, oldest first, and the sockets their
        #: messages went to: a later read sets them (:meth:`_note_read`) and pushes there. Bounded: beyond
        #: MAX_ACK_WAITS reads the oldest are forgotten (their messages stay served by request)
        self._ack_waits: deque[ReadAck] = deque(maxlen=MAX_ACK_WAITS)
        self._ack_socks: dict[tuple[IPAddress, int], None] = {}
        self._acks_learnt = False  # the last read set some of them: push there (:meth:`_after_read`)
        self.staged: deque[Outgoing] = deque()
        self.catchup_scheduled = False
        #: receiving sockets over their cap that this connection waits for (not read while > 0)
        self.holds = 0
        self._full: list[tuple[IPAddress, int]] = []  # over-cap receivers seen while feeding
        self._registered = False  # the current socket is in the event loop
        #: the events :meth:`_interest` last registered it for (-1: not by it). R or 0 is what the socket is
        #: registered for, given :attr:`holds` (every change of either calls :meth:`_interest` again)
        self._mask = -1

    def kept_pairing(self) -> tuple[int, bool]:
        """What the page kept of the peer's last probe or pong (path 0: see rxseq.py): (NPATHS, SPORT_IDX)."""
        return (0, False) if self._rx_page is None else self._rx_page.pairing(self._rx_at)

    def keep_pairing(self, npaths: int, sport_idx: bool) -> None:
        if self._rx_page is not None:
            self._rx_page.store_pairing(self._rx_at, npaths, sport_idx)

    @property
    def up(self) -> bool:
        return self.engine.state == PathState.UP

    @property
    def closing(self) -> bool:
        """A graceful close is under way: FIN sent, still reading until the peer's FIN."""
        return self.sock is not None and self.engine.state == PathState.DISCONNECTING

    @property
    def lane(self) -> Lane:
        """The owner's view (:mod:`pyrds.userspace.proto.pathset`), derived from the one home of a path's
        lifecycle: the engine's :class:`PathState` (the kernel's ``cp_state``) for the current socket, plus
        :attr:`confirmed`."""
        if self.sock is None:
            return Lane.DOWN
        if self.closing:
            return Lane.CLOSING
        return Lane.CONFIRMED if self.confirmed else Lane.CONNECTING

    def queue(self, msg: Outgoing, kick: bool = True) -> None:
        """``kick``: write it (or get a connection) now; False: the caller kicks later (a corked batch)."""
        if msg.sock_id and (self.engine.state is not _UP or self.staged):
            self.staged.append(msg)  # not on the wire yet: RDS_CANCEL_SENT_TO / close() can still drop it
        else:
            self._to_engine(msg)
        if kick:
            self.kick()

    def _to_engine(self, msg: Outgoing) -> None:
        msg.seq = self.engine.queue(msg.sport, msg.dport, msg.payload)
        if msg.sock_id:
            self.pending[msg.seq] = msg

    def cancel_many(self, msgs: Sequence[Outgoing]) -> None:
        """``rds_send_drop_to`` for those of ``msgs`` this path holds: dropped if still staged; in the
        engine, they leave the send queue (never written) or the retransmit queue (not written again after
        a reconnect: :meth:`PathEngine.cancel_many`). Bytes handed to TCP or waiting in :attr:`outbuf` still
        go out. One pass over :attr:`staged` and one over each engine queue, however many messages."""
        if self.staged:
            cancelled = {id(msg) for msg in msgs}
            kept = [msg for msg in self.staged if id(msg) not in cancelled]
            if len(kept) != len(self.staged):
                self.staged.clear()
                self.staged.extend(kept)
        seqs: set[int] = set()
        pending = self.pending
        for msg in msgs:
            if pending.get(msg.seq) is msg:
                del pending[msg.seq]
                seqs.add(msg.seq)
        if seqs:
            self.engine.cancel_many(seqs)

    def kick(self) -> None:
        """Write what is queued, or get a connection."""
        if self.engine.state is _UP:
            self.flush()
        elif self.conn.owner:
            self.conn.advance()
        elif self.index == 0:
            self.conn.doorbell()

    # -- connecting (owner side)
    def dial_soon(self, delay: float) -> None:
        if self.sock is not None or self.dial_scheduled:
            return
        self.dial_scheduled = True
        self.loop.call_later(delay, self._dial)

    def _dial(self) -> None:
        self.dial_scheduled = False
        if self.sock is not None or self.conn.closed or self.index not in self.conn.dials_now():
            return  # not this path's turn any more (every path was closed meanwhile): advance() dials it
        try:
            s = self.conn.new_socket()
        except OSError:  # EMFILE/ENFILE/ENOBUFS: retried after the reconnect backoff, never in a loop
            self.conn.path_down(self)
            return
        try:
            self.dial_port = bind_path_port(s, str(self.conn.laddr), self.index, avoid=self.dial_port)
            s.connect_ex((str(self.conn.faddr), self.host.config.tcp_peer_port))
        except OSError:
            s.close()
            self.conn.path_down(self)
            return
        self.sock = s
        self.gen += 1
        self.confirmed = False
        self.engine.connecting(time.monotonic())
        self.holds = 0
        self.loop.register(s, W, self._on_connect)
        self._registered = True
        self._mask = -1
        timeout_ms = self.host.config.sysctl["rds_tcp_user_timeout_ms"]
        if timeout_ms > 0:
            # TCP_USER_TIMEOUT (set once connected, like the kernel's rds_tcp_tune) bounds a connection's
            # unanswered data, not its SYN retries (tcp_syn_retries: over two minutes): a dial whose SYNs
            # go unanswered would keep the path, and every message queued for it, waiting that long
            gen = self.gen
            self.loop.call_later(timeout_ms / 1000.0, lambda: self._dial_timeout(gen))

    def _dial_timeout(self, gen: int) -> None:
        s = self.sock
        if gen != self.gen or s is None or self.engine.state != PathState.CONNECTING or _connected(s):
            return
        self.host.counters["tcp_dial_timed_out"] += 1
        log.info(
            "RDS/TCP %s -> %s path %d: dial from port %s not answered, given up",
            self.conn.laddr,
            self.conn.faddr,
            self.index,
            self.dial_port,
        )
        self.lost()

    def _on_connect(self, _mask: int) -> None:
        s = self.sock
        assert s is not None
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.lost()
            return
        self.established(s, registered=True)

    def established(self, s: socket.socket, registered: bool = False) -> None:
        self.sock = s
        try:
            self.peer_port = int(s.getpeername()[1])
        except OSError:
            self.peer_port = None
        self.gen += 1
        sysctl = self.host.config.sysctl
        tune(s, sysctl["rds_tcp_sndbuf"], sysctl["rds_tcp_rcvbuf"], sysctl["rds_tcp_user_timeout_ms"])
        self._advmss = advertised_mss(s)
        self._forget_reads()
        svc = self.loop
        self.holds = 0
        self._full.clear()
        self._registered = registered
        self._mask = -1
        self.outbuf = []
        self._interest(False)
        self.wire_bytes = 0
        self.acked_wire = 0
        self.confirmed = not self.conn.owner
        self.engine.connection_made(time.monotonic())
        if self.index != 0:  # 6.1 sets c_map_queued on every path's connect; it tells the owner we accepted
            self.engine.queue_cong_map()
        if not self.confirmed:
            gen = self.gen
            try:
                sent = s.send(OWNER_PREAMBLE)  # outside wire_bytes: it precedes every engine byte
            except OSError:
                sent = 0
            deadline = time.monotonic() + CONFIRM_TIMEOUT
            if sent == len(OWNER_PREAMBLE):
                svc.call_later(CONFIRM_POLL, lambda: self._confirm_poll(gen, deadline))
            else:
                svc.call_later(CONFIRM_TIMEOUT, lambda: self._confirm_poll(gen, deadline))
        if self.index == 0:
            self.conn.path0_up()
        self.flush()

    def _confirm_poll(self, gen: int, deadline: float) -> None:
        """Owner: confirm once the peer's TCP acked the preamble (nothing else is written yet), else at the
        deadline."""
        if gen != self.gen or self.confirmed or self.sock is None:
            return
        if unacked_bytes(self.sock) == 0 or time.monotonic() >= deadline:
            self.confirm()
        else:
            self.loop.call_later(CONFIRM_POLL, lambda: self._confirm_poll(gen, deadline))

    def confirm(self) -> None:
        """The peer accepted this connection (it sent something on it, acked the preamble, or
        CONFIRM_TIMEOUT passed)."""
        if self.confirmed or self.sock is None or self.closing or not self.up:
            return
        self.confirmed = True
        self.flush()
        self.conn.path_confirmed(self)

    def begin_close(self) -> None:
        """Graceful close: stop sending, FIN, keep reading until the peer's FIN (then :meth:`lost`)."""
        s = self.sock
        if s is None or self.closing:
            return
        if self.engine.state == PathState.CONNECTING:
            if not _connected(s):
                self.lost()  # no handshake yet: the peer cannot have sent anything on it
                return
            # TCP is up but its connect event was not handled yet: the peer may already have sent messages,
            # which its TCP saw acked (a 7.x kernel frees them on that). Close it like any other connection.
            self.established(s, registered=True)
        self.check_acks()
        self.outbuf = []
        self.engine.disconnecting(time.monotonic())
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        svc = self.loop
        self._interest(False)
        gen = self.gen
        svc.call_later(CLOSE_TIMEOUT, lambda: self._close_timeout(gen))

    def _close_timeout(self, gen: int) -> None:
        if gen == self.gen and self.closing and self.sock is not None:
            self._drain_nonblocking()
            if self.sock is not None:
                self.lost()

    def abandon(self) -> None:
        """Give the connection up at once: read what it already holds, then :meth:`lost`."""
        self._drain_nonblocking()
        if self.sock is not None:
            self.lost()

    def read_pending(self) -> None:
        """Read and handle what the socket already holds, without waiting (and send the replies)."""
        self._drain_nonblocking()
        if self.sock is not None and self.up:
            self.flush()

    def _drain_nonblocking(self) -> None:
        while self.sock is not None and not self.holds:
            try:
                data = self.sock.recv(WRITE_CHUNK, socket.MSG_DONTWAIT)
            except OSError:
                return
            if not data:
                return
            data, acked = _acked_read(self.sock, data, self._advmss if self.up else 0)
            self._note_read(acked)
            if not self._feed(data):
                return
            self._after_read()
            self._hold_for_full()

    def lost(self) -> None:
        """The connection is gone (the peer's FIN or reset was read, a dial failed, or a protocol error):
        partial input is discarded, unacked messages wait for the next connection of this path."""
        s = self.sock
        if s is not None:
            self.check_acks()
            self.loop.unregister(s)
            self._registered = False
            self.holds = 0
            unread = unread_bytes(s)
            if unread:
                # bytes the peer's TCP saw acked (an RDS/TCP sender frees messages on that) but never read:
                # closing now loses them. Counted so a transfer that lost messages shows where.
                self.host.counters["tcp_close_unread"] += 1
                self.host.counters["tcp_close_unread_bytes"] += unread
                log.warning(
                    "RDS/TCP %s -> %s path %d: closing with %d unread bytes",
                    self.conn.faddr,
                    self.conn.laddr,
                    self.index,
                    unread,
                )
            s.close()
            self.sock = None
            self.host.counters["conn_reset"] += 1
        self.outbuf = []
        self.confirmed = False
        self._forget_reads()
        self.gen += 1
        if self.engine.state != PathState.DOWN:
            self.engine.connection_lost(time.monotonic())
        self.conn.path_down(self)

    def close(self) -> None:
        if self.sock is not None:
            self.loop.unregister(self.sock)
            self._registered = False
            self.sock.close()
            self.sock = None

    # -- I/O
    def flush(self) -> None:
        s = self.sock
        if s is None:
            return
        written_before = self.wire_bytes
        engine = self.engine
        if engine.state is _UP and self.confirmed:
            while self.staged:
                self._to_engine(self.staged.popleft())
            held = False
            while True:
                out = self.outbuf
                if not out:
                    # has_output first: after a write that took everything, or a read that queued no pong,
                    # asking buffers_to_send for nothing was the costlier call (once or twice per message)
                    if held or not engine.has_output():
                        break
                    out = self.outbuf = [*engine.buffers_to_send(WRITE_CHUNK)]
                    if self._rx_page is not None and engine.next_tx_seq > self._tx_reserved:
                        self._reserve_tx()
                    if engine.held:
                        held = True
                        self._catchup_wait()
                    if not out:
                        break
                try:
                    n = s.send(out[0]) if len(out) == 1 else s.sendmsg(out)
                except (BlockingIOError, InterruptedError):
                    self.host.counters["tcp_sndbuf_full"] += 1
                    self._interest(True)
                    break
                except OSError:
                    self.begin_close()  # reset by the peer: what it sent before is still to be read
                    return
                self.wire_bytes += n
                _sent(out, n)
            if not self.outbuf and self._mask & W:  # else _interest(False) would change nothing (``_mask``)
                self._interest(False)
            if self.acked_wire >= written_before and not self._acks_urgent():
                # the last look found every byte written before this flush acked: SIOCOUTQ now could only
                # tell of the bytes just written, which TCP acks later, and nobody waits for them (request/
                # response: one ioctl per message less); the next read or the ack poll asks
                if self.pending:
                    self._ack_poll(False)
                return
        self.check_acks()

    def _reserve_tx(self) -> None:
        """Before a message numbered at or above the page's reservation reaches the wire: reserve a block
        more (rxseq.py), so that a service started after a kill numbers above everything written."""
        page = self._rx_page
        if page is not None:
            self._tx_reserved = self.engine.next_tx_seq + TX_RESERVE
            page.reserve_tx(self._rx_at, self._tx_reserved)

    def _catchup_wait(self) -> None:
        """Path 0 still holds messages older than the fan-out (:mod:`pyrds.userspace.proto.path`): count it
        and try again shortly (7.x requeues its send worker)."""
        self.host.counters["mprds_catchup_tx0_retries"] += 1
        if not self.catchup_scheduled:
            self.catchup_scheduled = True
            self.loop.call_later(ACK_POLL, self._catchup_retry)

    def _catchup_retry(self) -> None:
        self.catchup_scheduled = False
        self.conn.paths[0].check_acks()  # path 0's acks are what this path waits for
        self.flush()

    def release(self, rows: list[AckedMessage] | tuple[AckedMessage, ...]) -> None:
        """Messages the engine dropped without sending them again (the peer restarted): free their socket
        accounting like acked ones."""
        for row in rows:
            msg = self.pending.pop(row.seq, None)
            if msg is not None:
                self.host.acked(msg)

    def check_acks(self) -> None:
        """Messages whose last byte the peer's TCP acked: bytes the socket accepted minus SIOCOUTQ (which
        counts a FIN too: conservative until the FIN is acked). Nothing before the connection is established:
        a dialling socket's SIOCOUTQ is 0 and says nothing about what the last connection left unacked."""
        s = self.sock
        if s is None or self.engine.state == PathState.CONNECTING:
            return
        self.host.counters["tcp_ack_checks"] += 1
        outq = unacked_bytes(s)
        if outq is None:
            return
        through = self.wire_bytes - outq
        if through > self.acked_wire:
            self.acked_wire = through
        for acked in self.engine.acked_through(through if through > 0 else 0):
            msg = self.pending.pop(acked.seq, None)
            if msg is not None:
                self.host.acked(msg)
        if self.pending:
            self._ack_poll()

    def _acks_urgent(self) -> bool:
        """Whether a sender waits for acks: the stack says so for one of the ACK_LOOK newest unacked
        messages (a send buffer half full, a zerocopy completion)."""
        host = self.host
        for n, msg in enumerate(reversed(self.pending.values())):
            if n == ACK_LOOK:
                break
            if host.acks_awaited(msg):
                return True
        return False

    def _ack_poll(self, urgent: bool | None = None) -> None:
        """Ask TCP for acks again later: after ACK_POLL when a sender waits for them (:meth:`_acks_urgent`;
        ``urgent``: the caller just asked), else after ACK_POLL_IDLE. A timer already out that runs soon
        enough stays the only one (none is cancelled: a later one finds it is not the current one and does
        nothing)."""
        now = time.monotonic()
        at = self._ack_timer_at
        if at is not None and at <= now + ACK_POLL:
            return
        if urgent is None:
            urgent = self._acks_urgent()
        delay = ACK_POLL if urgent else ACK_POLL_IDLE
        if at is not None and at <= now + delay:
            return
        self._ack_timer_at = now + delay
        self.loop.call_later(delay, self._ack_timer)

    def _ack_timer(self) -> None:
        at = self._ack_timer_at
        if at is None or time.monotonic() < at:
            return  # superseded: a sooner timer ran (and set up its own successor, if needed)
        self._ack_timer_at = None
        self.check_acks()

    def _on_io(self, mask: int) -> None:
        s = self.sock
        if s is None:
            return
        counters = self.host.counters
        if mask & W:
            counters["tcp_write_space_calls"] += 1
            self.flush()
        if not mask & R or self.sock is None:
            return
        counters["tcp_data_ready_calls"] += 1
        try:
            data = s.recv(WRITE_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            data = b""  # a reset: everything queued before it has been read
            if exc.errno == errno.ETIMEDOUT:  # TCP_USER_TIMEOUT or keepalive: the peer stopped answering
                counters["tcp_timed_out"] += 1
        if not data:
            self.lost()
            return
        if self._rx_page is None:
            # acked before anything read here can reach a reader (docs/userspace.md, "Restart")
            data, acked = _acked_read(s, data, self._advmss if self.up else 0)
        else:
            acked = True  # each message's sequence is stored before it can reach a reader (_event)
        self._note_read(acked)
        if self._feed(data):
            if self._acks_learnt:
                self._after_read()
            if self._full:
                self._hold_for_full()
            if not self.confirmed:
                self.confirm()
            self.flush()  # pongs, and acks may have advanced

    # -- when received messages may be pushed (docs/userspace.md, "Restart")
    def _note_read(self, acked: bool) -> None:
        """Before the messages of a read are fed: ``acked``, the ACK for all of it is out, and so for every
        earlier read of this connection (TCP acks cumulatively), whose messages may now be pushed too. Else
        the earlier reads TCP sent a segment after (``tcpi_segs_out`` moved since) are acked."""
        waits = self._ack_waits
        self._read_acked = acked
        if acked:
            self._read_ack = None
            if waits:
                for wait in waits:
                    wait.acked = True
                waits.clear()
                self._acks_learnt = True
            return
        s = self.sock
        now = segments_out(s) if s is not None else None
        if now is not None:
            while waits and waits[0].segs_out is not None and waits[0].segs_out != now:
                waits.popleft().acked = True
                self._acks_learnt = True
        self._read_ack = ReadAck(now)
        waits.append(self._read_ack)

    def _after_read(self) -> None:
        """After a read was fed: when it let messages of earlier reads be pushed, push what waits on every
        socket such messages went to (an acked read's own messages were pushed as they were delivered). The
        sockets are remembered until no read waits any more."""
        if not self._acks_learnt:
            return
        self._acks_learnt = False
        socks = list(self._ack_socks)
        if not self._ack_waits:
            self._ack_socks = {}
        for daddr, dport in socks:
            self.host.push_acked(daddr, dport)

    def _forget_reads(self) -> None:
        """A new or lost connection: an ACK on it says nothing about the reads of the last one."""
        self._read_ack = None
        self._ack_waits.clear()
        self._ack_socks = {}
        self._acks_learnt = False

    # -- bounded receive (docs/userspace.md, "Bounded resources")
    def _interest(self, write: bool) -> None:
        """Poll the current socket for input unless a full receiver holds this connection, and for output
        when ``write``; with neither it leaves the event loop (the peer's TCP then sees a closed window)."""
        s = self.sock
        if s is None:
            return
        mask = (0 if self.holds else R) | (W if write else 0)
        if not mask:
            if self._registered:
                self.loop.unregister(s)
                self._registered = False
        elif self._registered:
            if mask != self._mask:  # twice per message otherwise, for nothing
                self.loop.modify(s, mask, self._on_io)
        else:
            self.loop.register(s, mask, self._on_io)
            self._registered = True
        self._mask = mask

    def _hold_for_full(self) -> None:
        """After a read: every receiving socket that went over its receive cap holds this connection (it is
        not read) until that socket drained to half its cap or closed."""
        if not self._full:
            return
        full, self._full = self._full, []
        gen = self.gen
        held = self.holds
        for daddr, dport in dict.fromkeys(full):
            if self.host.hold_reader(daddr, dport, id(self), lambda: self._release_hold(gen)):
                self.holds += 1
        if self.holds and not held:
            log.info(
                "RDS/TCP %s -> %s path %d: a receiving socket is over its cap; not read until it drains",
                self.conn.faddr,
                self.conn.laddr,
                self.index,
            )
            self._interest(bool(self.outbuf))

    def _release_hold(self, gen: int) -> None:
        if gen != self.gen or self.sock is None or not self.holds:
            return
        self.holds -= 1
        if not self.holds:
            self._interest(bool(self.outbuf))

    def _feed(self, data: bytes) -> bool:
        """Feed received bytes to the engine; False when a protocol error dropped the connection."""
        # the kernel reads rds_sysctl_ping_enable for every message (rds_recv_incoming): a change applies to
        # connections that are already up
        self.engine.ping_enable = bool(self.host.config.sysctl["ping_enable"])
        try:
            events = self.engine.feed(data, time.monotonic())
        except ProtocolError as exc:
            log.warning(
                "RDS/TCP %s -> %s path %d: %s; dropping the connection",
                self.conn.faddr,
                self.conn.laddr,
                self.index,
                exc,
            )
            self.host.counters["tcp_protocol_error"] += 1
            for ev in cast("list[Event]", exc.partial):
                self._event(ev)
            self.lost()
            return False
        for ev in events:
            self._event(ev)
        return True

    def _event(self, ev: Event) -> None:
        """One event of the engine; every kind is named, so a new one cannot be dropped unnoticed."""
        host = self.host
        match ev:
            case MessageReceived(header=h, payload=payload):
                if self._rx_page is not None:
                    self._rx_page.store(self._rx_at, h.sequence + 1)
                now = time.monotonic_ns()
                inc = Incoming(
                    self.conn.faddr,
                    self.conn.laddr,
                    h.sport,
                    h.dport,
                    payload,
                    h.sequence,
                    0,
                    lat=(now, now, now, 0),
                    # to the reader's data channel only when our TCP's ACK for it is surely out (the read
                    # was acked, :func:`_acked_read`, or a later read of this connection was); until then
                    # served by request
                    pushable=self._read_acked,
                    read_ack=self._read_ack,
                )
                room = host.deliver(inc)
                if inc.read_ack is not None and len(self._ack_socks) < MAX_ACK_SOCKS:
                    self._ack_socks[(self.conn.laddr, h.dport)] = None
                if not room:
                    self._full.append((self.conn.laddr, h.dport))
            case CongMapReceived(map=cmap):
                host.peer_cong_map(self.conn.faddr, cmap)
            case PingReceived() | DuplicateDropped():
                count_receive_event(host.counters, ev)
            case NpathsNegotiated(npaths=npaths, sport_idx=sport_idx):
                self.conn.negotiated(npaths, sport_idx)
            case PeerGenChanged(flushed=flushed):
                if self._rx_page is not None:
                    self._rx_page.store(self._rx_at, 0)  # the peer's numbers start again, and ours (from 1)
                    self._tx_reserved = 0
                    self._rx_page.reserve_tx(self._rx_at, 0)
                self.release(flushed)
                self.conn.peer_restarted(self)
            case PongReceived():
                if self.index == 0:
                    self.conn.pong_received()  # before its handshake (NpathsNegotiated) is acted on
            case CongMapDropped():
                pass  # a map of the wrong length is ignored
            case _:
                assert_never(ev)


def _sent(out: list[bytes | memoryview], n: int) -> None:
    """TCP took the first ``n`` bytes of ``out``: drop what went, keep a view of a buffer's unsent rest (no
    copy of it, as slicing bytes would make)."""
    for i, buf in enumerate(out):
        size = len(buf)
        if n < size:
            del out[:i]
            if n:
                out[0] = memoryview(buf)[n:]
            return
        n -= size
    del out[:]


def _acked_read(s: socket.socket, data: bytes, advmss: int = 0) -> tuple[bytes, bool]:
    """``data`` just read from ``s``, plus whatever more it takes until our TCP has acked all of it; and
    whether it did (False: the receive queue was still not empty, so the ACK for the last bytes may wait).

    TCP_QUICKACK (:func:`ack_now`) sends the pending ACK only when the read left the receive queue empty
    (``tcp_cleanup_rbuf``: ``!sk_rmem_alloc``) or more than one MSS is unacked; a segment that arrived after
    the read keeps the ACK delayed, and a service killed then would see the peer resend what it had already
    delivered (a duplicate after a restart, seen under load in ``test_restart_netns[receiver]``). So read on,
    without waiting, until SIOCINQ shows the queue empty after the ACK (at most :data:`ACK_READS` more
    reads).

    A peer that keeps the queue full (a bulk sender) rarely lets it be empty, and its messages then went to
    the reader by request, one round trip each. The MSS rule covers that case: with ``advmss`` > 0 (the
    connection's advertised MSS, an upper bound of ``icsk_ack.rcv_mss``; only while the connection is
    ESTABLISHED or CLOSE_WAIT, where TCP_QUICKACK runs ``tcp_cleanup_rbuf``), when SIOCINQ says at least
    ``advmss`` bytes wait beyond what we read, one more TCP_QUICKACK either sends an ACK (which acks all
    that arrived, our bytes too) or finds none owed, or finds less than one MSS unacked since the last ACK
    sent (``rcv_nxt - rcv_wup <= rcv_mss``): then that ACK's sequence ``rcv_wup`` is at least ``rcv_nxt -
    advmss``, which is past the end of what we read (``rcv_nxt - SIOCINQ``). Either way our bytes are acked.
    """
    ack_now(s)
    more: list[bytes] = []
    acked = False
    for _ in range(ACK_READS + 1):
        waiting = unread_bytes(s)
        if not waiting:
            acked = True
            break
        if advmss and waiting >= advmss:
            ack_now(s)  # SIOCINQ came before it: the queue held at least advmss beyond our bytes
            acked = True
            break
        if len(more) == ACK_READS:
            break
        try:
            chunk = s.recv(WRITE_CHUNK, socket.MSG_DONTWAIT)
        except OSError:  # EAGAIN, or a reset: the next read sees it
            break
        if not chunk:  # the peer's FIN: the next read sees it
            break
        more.append(chunk)
        ack_now(s)
    return (data + b"".join(more) if more else data), acked


def _connected(s: socket.socket) -> bool:
    """The TCP handshake of a non-blocking connect completed (whether or not its event was handled)."""
    try:
        s.getpeername()
    except OSError:
        return False
    return not s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
