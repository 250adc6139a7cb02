"""One RDS/TCP connection path (``struct rds_conn_path``) as a sans-IO state machine.

Send side (net/rds/send.c, tcp_send.c): every message gets the path's next sequence number (from 1; pings and
pongs too); messages handed to TCP stay unacked until the peer's TCP acknowledged their last byte; after a
reconnect every unacked message is sent again, first and in order, with ``RDS_FLAG_RETRANSMITTED`` and its
old sequence number.  Path 0 sends the local congestion map (seq 0, never retransmitted) before anything else.

Receive side (tcp_recv.c, recv.c ``rds_recv_incoming``): ``h_flags == CONG_BITMAP`` is a congestion map
(ignored unless exactly 8192 bytes, never touches sequence state); otherwise a message with
``seq < next_rx_seq`` and RETRANSMITTED set is dropped, anything else sets ``next_rx_seq = seq + 1``;
a ping (dport 0, sport != 0) is answered with a pong when ping_enable; probe ping/pong carry the NPATHS
handshake.  Regular pongs
(sport 0, dport != 1) are ordinary messages for the socket bound to dport, as in the kernel (rds-ping).

Transports that delimit messages themselves (RDS/IB) use the same engine message by message instead of as a
byte stream: :meth:`PathEngine.next_message` / :meth:`PathEngine.take_cong_map` instead of ``bytes_to_send``,
:meth:`PathEngine.receive` instead of ``feed``, and RDS-level acks (:meth:`PathEngine.acked_seq`, the peer's
``h_ack``) instead of TCP byte counts (``acked_through``). The sequence numbers, the retransmit queue, the
requeue-as-RETRANSMITTED after reconnect, the duplicate rule and the pong queue are the same code for both.

Multipath catch-up (7.x ``rds_mprds_cp0_catchup``): when a connection fans out (``c_npaths`` becomes > 1 from
a handshake) the connection records path 0's next sequence number (:meth:`PathEngine.begin_catchup` on path
0's engine); from then on a path > 0 (given ``lane0``) transmits no message while path 0 still holds, unacked
or unsent, a message with a smaller sequence number.  A socket's first messages, sent on path 0 before NPATHS
was known, so reach the peer before its later ones on its hashed path.  Each time a path > 0 has to wait,
``catchup_retries`` (``mprds_catchup_tx0_retries``) is incremented.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Collection, Set
from dataclasses import dataclass

from pyrds.constants import (
    RDS_CONG_MAP_BYTES,
    RDS_FLAG_PROBE_PORT,
    RDS_MAX_MSG_SIZE,
    RDS_MPATH_WORKERS,
    HeaderFlag,
)
from pyrds.userspace.proto.cong import CongestionMap, encode_cong_map_message
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
    UnackedMessage,
)
from pyrds.userspace.proto.framer import Frame, MessageFramer
from pyrds.userspace.proto.handshake import (
    AddressLike,
    negotiate_npaths,
    peer_gen_num,
    peer_sport_idx,
    probe_exthdrs,
)
from pyrds.userspace.proto.header import ExtHeader, RDSHeader

__all__ = ["PathEngine", "PathState", "SendQueueFull"]


#: a path resumes its send sequence only below this (:meth:`PathEngine.resume_tx`)
_RESUME_TX_LIMIT = 1 << 62


class PathState(enum.IntEnum):
    """``RDS_CONN_*`` (values as in net/rds/rds.h)."""

    DOWN = 0
    CONNECTING = 1
    DISCONNECTING = 2
    UP = 3
    ERROR = 5


#: a payload this large goes to the socket as its own buffer (a gathered write) instead of being copied
OWN_BUFFER = 8192
_CONG_BITMAP = int(HeaderFlag.CONG_BITMAP)  # a plain int: an IntFlag operand costs an enum call per send


class SendQueueFull(Exception):
    """:meth:`PathEngine.queue` would exceed the caller-supplied queue limits."""


@dataclass(slots=True)
class _Out:
    header: RDSHeader
    payload: bytes
    end: int = 0  # connection byte offset just past this message, once written
    wire: bytes = b""  # ``header.encode()`` when already made (the header is frozen), else empty


class PathEngine:
    """State of one (laddr, faddr, path index) TCP connection; see the module docstring."""

    def __init__(
        self,
        laddr: AddressLike,
        faddr: AddressLike,
        index: int = 0,
        *,
        local_map: CongestionMap | None = None,
        ping_enable: bool = True,
        max_len: int = RDS_MAX_MSG_SIZE,
        max_queued_bytes: int | None = None,
        max_queued_msgs: int | None = None,
        max_pongs: int | None = None,
        lane0: PathEngine | None = None,
    ) -> None:
        self.laddr = laddr
        self.faddr = faddr
        self.index = index
        self.local_map = local_map if local_map is not None else CongestionMap()
        self.ping_enable = ping_enable
        self.max_len = max_len
        self.max_queued_bytes = max_queued_bytes
        self.max_queued_msgs = max_queued_msgs
        #: pongs (sport 0) queued or unacked at most; a ping beyond it is not answered (``pongs_dropped``)
        self.max_pongs = max_pongs
        self._pongs = 0  # pongs in both queues
        self.framer = MessageFramer(max_len)
        #: the kernel's ``cp_state`` (read it; the engine's methods change it). Plain attributes, as
        #: ``next_tx_seq`` and ``held`` are: read several times per message on the hot path
        self.state = PathState.DOWN
        self.state_changed_at: float | None = None
        self.next_tx_seq = 1  # ``cp_next_tx_seq``: the sequence number of the next message queued
        self._next_rx_seq = 0
        self._send_queue: deque[_Out] = deque()  # not yet written on this connection
        self._written: deque[_Out] = deque()  # written on this connection, not yet acked
        self._queued_bytes = 0  # payload bytes in both queues
        self._cong_pending = False
        self._tx_bytes = 0  # bytes handed out by bytes_to_send() on this connection
        self._acked_bytes = 0
        self._npaths = 0
        self._with_sport_idx = False
        self._peer_gen = 0
        self.pongs_dropped = 0
        #: NPATHS on our probes and pongs while the peer has not shown SPORT_IDX (a peer that has, dials each
        #: path from a port naming it, so it always gets RDS_MPATH_WORKERS)
        self.advertise_npaths = RDS_MPATH_WORKERS
        self.last_advertised = 0  # NPATHS on the last probe/pong queued (0: none yet)
        #: path 0's engine, for a path > 0: the catch-up rule (module doc) looks at its queues
        self.lane0 = lane0 if index > 0 else None
        self.catchup_tx_seq = 0  # path 0: ``c_cp0_mprds_catchup_tx_seq`` (0: no catch-up)
        self.catchup_retries = 0  # path > 0: times it had to wait for path 0 (``mprds_catchup_tx0_retries``)
        #: the last :meth:`buffers_to_send` kept messages back because path 0 is still catching up
        self.held = False

    # -- info ---------------------------------------------------------------------------------------------
    @property
    def next_rx_seq(self) -> int:
        return self._next_rx_seq

    @property
    def npaths(self) -> int:
        """Negotiated ``c_npaths`` (0 until a probe ping/pong was received)."""
        return self._npaths

    @property
    def peer_sport_idx(self) -> bool:
        """``c_with_sport_idx``: the last probe ping/pong received carried SPORT_IDX."""
        return self._with_sport_idx

    @property
    def peer_gen_num(self) -> int:
        return self._peer_gen

    @property
    def queued_bytes(self) -> int:
        """Payload bytes not yet acked (queued or in flight)."""
        return self._queued_bytes

    @property
    def queued_pongs(self) -> int:
        """Pongs (sport 0) not yet acked."""
        return self._pongs

    @property
    def queued_msgs(self) -> int:
        return len(self._send_queue) + len(self._written)

    @property
    def unacked(self) -> list[UnackedMessage]:
        """Messages handed to TCP and not acked yet, including those requeued for retransmission."""
        rows = [_row(m) for m in self._written]
        rows.extend(_row(m) for m in self._send_queue if m.header.flags & HeaderFlag.RETRANSMITTED)
        rows.sort(key=lambda r: r.seq)
        return rows

    @property
    def unsent(self) -> list[UnackedMessage]:
        """Messages queued but never handed to TCP."""
        return [_row(m) for m in self._send_queue if not m.header.flags & HeaderFlag.RETRANSMITTED]

    # -- send side ----------------------------------------------------------------------------------------
    def queue(
        self,
        sport: int,
        dport: int,
        payload: bytes,
        extra_flags: int = 0,
        exthdr: tuple[ExtHeader, ...] | list[ExtHeader] | None = None,
    ) -> int:
        """Queue a message (any state: it goes out once UP); returns its sequence number."""
        if len(payload) > self.max_len:
            raise ValueError(f"payload of {len(payload)} bytes exceeds {self.max_len}")
        if extra_flags & ~0xFF or extra_flags & _CONG_BITMAP:
            raise ValueError("extra_flags must be a u8 without CONG_BITMAP")
        if (self.max_queued_msgs is not None and self.queued_msgs + 1 > self.max_queued_msgs) or (
            self.max_queued_bytes is not None and self._queued_bytes + len(payload) > self.max_queued_bytes
        ):
            raise SendQueueFull(f"path {self.index}: {self.queued_msgs} msgs / {self._queued_bytes} bytes")
        return self._enqueue(sport, dport, bytes(payload), extra_flags, tuple(exthdr or ()))

    def _enqueue(
        self, sport: int, dport: int, payload: bytes, flags: int, exthdr: tuple[ExtHeader, ...]
    ) -> int:
        seq = self.next_tx_seq
        size = len(payload)
        header = RDSHeader(seq, 0, size, sport, dport, flags, 0, 0, exthdr)
        wire = header.encode()  # validate ranges now, not at drain time; kept for the write
        self.next_tx_seq += 1
        self._send_queue.append(_Out(header, payload, 0, wire))
        self._queued_bytes += size
        if sport == 0:
            self._pongs += 1
        return seq

    def send_ping(self, sport: int) -> int:
        """Queue a ping from ``sport`` to port 0 (the peer answers with an empty pong to ``sport``)."""
        return self.queue(sport, 0, b"")

    def send_probe(self) -> int:
        """Queue the multipath handshake ping (``rds_send_ping``): sport 1 -> dport 0 with NPATHS and
        SPORT_IDX."""
        return self.queue(RDS_FLAG_PROBE_PORT, 0, b"", exthdr=self._probe_exthdrs(self._with_sport_idx))

    def _probe_exthdrs(self, peer_sport_idx: bool) -> tuple[ExtHeader, ...]:
        self.last_advertised = RDS_MPATH_WORKERS if peer_sport_idx else self.advertise_npaths
        return probe_exthdrs(self.last_advertised)

    # -- multipath catch-up (module doc) ------------------------------------------------------------------
    def begin_catchup(self, pending: int = 0) -> None:
        """Path 0 at fan-out: paths > 0 wait until every message path 0 holds now is acked. ``pending``:
        messages the caller still holds for path 0 that will get the next sequence numbers."""
        self.catchup_tx_seq = self.next_tx_seq + pending

    def catching_up(self) -> bool:
        """Path 0: its oldest message not yet acked (retransmit queue, then send queue) is older than the
        catch-up sequence number."""
        if not self.catchup_tx_seq:
            return False
        if self._written and self._written[0].header.sequence < self.catchup_tx_seq:
            return True
        return bool(self._send_queue) and self._send_queue[0].header.sequence < self.catchup_tx_seq

    def has_output(self) -> bool:
        """:meth:`buffers_to_send` would return something while UP: a message or the map is queued."""
        return bool(self._send_queue) or self._cong_pending

    def queue_cong_map(self) -> None:
        """Send ``local_map`` before the next queued message (coalesces like ``c_map_queued``)."""
        self._cong_pending = True

    def bytes_to_send(self, max_bytes: int | None = None) -> bytes:
        """Drain whole messages to write to the TCP socket (at least one if any, then up to ``max_bytes``)."""
        return b"".join(self.buffers_to_send(max_bytes))

    def buffers_to_send(self, max_bytes: int | None = None, max_buffers: int = 64) -> list[bytes]:
        """What :meth:`bytes_to_send` drains, as buffers to write in this order (``socket.sendmsg``): a
        payload of :data:`OWN_BUFFER` bytes or more is its own buffer, as queued (not copied), everything
        else is joined; at most ``max_buffers`` buffers (fewer messages then)."""
        self.held = False
        if self.state != PathState.UP:
            return []
        out: list[bytes] = []
        small = bytearray()
        size = 0
        if self._cong_pending:
            self._cong_pending = False
            small += encode_cong_map_message(self.local_map)
            size = len(small)
        if self._send_queue and self.lane0 is not None and self.lane0.catching_up():
            self.held = True
            self.catchup_retries += 1
            self._tx_bytes += size
            return [bytes(small)] if small else []
        queue = self._send_queue
        buffers = 0  # len(out)
        while queue and (max_bytes is None or not size or size < max_bytes) and buffers < max_buffers - 2:
            msg = queue.popleft()
            hdr = msg.wire or msg.header.encode()
            small += hdr
            payload = msg.payload
            plen = len(payload)
            if plen >= OWN_BUFFER:
                out.append(bytes(small))
                out.append(payload)
                buffers += 2
                small = bytearray()
            else:
                small += payload
            size += len(hdr) + plen
            msg.end = self._tx_bytes + size
            self._written.append(msg)
        if small:
            out.append(bytes(small))
        self._tx_bytes += size
        return out

    @property
    def tx_bytes(self) -> int:
        """Bytes handed out by :meth:`bytes_to_send` on this connection."""
        return self._tx_bytes

    def acked_through(self, total_bytes_acked: int) -> list[AckedMessage]:
        """The peer's TCP acked ``total_bytes_acked`` bytes of this connection: free fully acked messages."""
        if total_bytes_acked > self._tx_bytes:
            raise ValueError(f"acked {total_bytes_acked} > written {self._tx_bytes}")
        if total_bytes_acked <= self._acked_bytes:
            return []
        self._acked_bytes = total_bytes_acked
        done: list[AckedMessage] = []
        while self._written and self._written[0].end <= total_bytes_acked:
            done.append(self._release(self._written.popleft()))
        return done

    def _release(self, msg: _Out) -> AckedMessage:
        """Forget ``msg`` (acked or flushed): its bytes and pong no longer count against the queue."""
        self._queued_bytes -= len(msg.payload)
        h = msg.header
        if h.sport == 0:
            self._pongs -= 1
        return AckedMessage(h.sequence, h.length, h.sport, h.dport, h.flags)

    # -- message-at-a-time use (RDS/IB: the transport frames each message itself) ----------------------------
    def take_cong_map(self) -> bool:
        """The congestion map is due (path 0 after connect, or :meth:`queue_cong_map`): clear and say so.
        ``local_map`` is then sent before the next message, as :meth:`bytes_to_send` does for TCP."""
        if self.state != PathState.UP or not self._cong_pending:
            return False
        self._cong_pending = False
        return True

    def next_message(self) -> tuple[RDSHeader, bytes] | None:
        """The oldest queued message, moved to the retransmit queue (``rds_send_xmit`` moves it to
        ``cp_retrans`` as it picks it); ``None`` when not UP, nothing is queued, or path 0 is catching up.
        It stays there until :meth:`acked_seq` or :meth:`reset_sequences` releases it, and a reconnect
        requeues it as a retransmission, exactly like a message written by :meth:`bytes_to_send`."""
        self.held = False
        if self.state != PathState.UP or not self._send_queue:
            return None
        if self.lane0 is not None and self.lane0.catching_up():
            self.held = True
            self.catchup_retries += 1
            return None
        msg = self._send_queue.popleft()
        self._written.append(msg)
        return msg.header, msg.payload

    def next_retransmission(self) -> int:
        """The sequence of the next message to send if it is a retransmission (RETRANSMITTED), else 0."""
        if self._send_queue and self._send_queue[0].header.flags & HeaderFlag.RETRANSMITTED:
            return self._send_queue[0].header.sequence
        return 0

    def drop_next(self) -> AckedMessage:
        """Release the next message to send without sending it (RDS/IB drops a retransmission that carries
        an RDMA op: send.c ``rds_send_xmit``)."""
        return self._release(self._send_queue.popleft())

    def acked_seq(self, ack: int) -> list[AckedMessage]:
        """The peer received every message up to sequence ``ack`` (``rds_send_drop_acked``: an RDS-level
        ack, h_ack or the connect private data's ack_seq): release them, oldest first. Retransmissions
        requeued by a reconnect and not yet resent are released too (the private data's ack_seq arrives
        exactly then)."""
        done: list[AckedMessage] = []
        while self._written and self._written[0].header.sequence <= ack:
            done.append(self._release(self._written.popleft()))
        while (
            self._send_queue
            and self._send_queue[0].header.flags & HeaderFlag.RETRANSMITTED
            and self._send_queue[0].header.sequence <= ack
        ):
            done.append(self._release(self._send_queue.popleft()))
        return done

    def cancel_many(self, seqs: Collection[int]) -> list[AckedMessage]:
        """``rds_send_drop_to``: take the messages with these sequence numbers off this path, from the
        retransmit queue (written, never retransmitted after a reconnect) or the send queue (never sent),
        and release their bytes and pongs; returns what was released (retransmit queue first, each queue in
        its order). A sequence number the path holds no message of (acked or flushed already) is ignored.
        One pass over each queue, whatever the number of messages: the others keep their order. Bytes
        already handed to the transport still go out (the kernel's xmit holds its own reference to the
        message). The sequence numbers are not reused: the peer sees gaps, which ``rds_recv_incoming``
        accepts."""
        wanted = seqs if isinstance(seqs, (set, frozenset)) else set(seqs)
        released: list[AckedMessage] = []
        if wanted:
            self._written = self._without(self._written, wanted, released)
            self._send_queue = self._without(self._send_queue, wanted, released)
        return released

    def _without(self, queue: deque[_Out], wanted: Set[int], released: list[AckedMessage]) -> deque[_Out]:
        """``queue`` without the messages whose sequence is in ``wanted`` (released onto ``released``)."""
        kept: deque[_Out] = deque()
        for msg in queue:
            if msg.header.sequence in wanted:
                released.append(self._release(msg))
            else:
                kept.append(msg)
        return kept

    # -- connection life cycle ----------------------------------------------------------------------------
    def connecting(self, now: float) -> None:
        self._set_state(PathState.CONNECTING, now)

    def connection_made(self, now: float) -> None:
        """TCP is established: requeue unacked messages as retransmissions, path 0 queues the cong map."""
        if self.state == PathState.UP:
            raise ValueError("path is already up")
        resend = [_Out(m.header.with_flags(HeaderFlag.RETRANSMITTED), m.payload) for m in self._written]
        self._written.clear()
        self._send_queue.extendleft(reversed(resend))
        self._tx_bytes = 0
        self._acked_bytes = 0
        self.framer.reset()
        if self.index == 0:
            self._cong_pending = True
        self._set_state(PathState.UP, now)

    def connection_lost(self, now: float) -> None:
        """TCP is gone: partial input is discarded; unacked messages wait for the next connection."""
        self.framer.reset()
        self._cong_pending = False
        self._set_state(PathState.DOWN, now)

    def disconnecting(self, now: float) -> None:
        self._set_state(PathState.DISCONNECTING, now)

    def _set_state(self, state: PathState, now: float) -> None:
        self.state = state
        self.state_changed_at = now

    def resume_rx(self, next_rx_seq: int) -> None:
        """Start the receive side where an earlier incarnation of this node left it (its readers have
        every message below ``next_rx_seq``; a resent copy of one, RETRANSMITTED, is then dropped as old).
        Only before anything was received, and only a value a sequence can hold."""
        if self._next_rx_seq == 0 and 0 <= next_rx_seq <= 0xFFFFFFFFFFFFFFFF:
            self._next_rx_seq = next_rx_seq

    def resume_tx(self, next_tx_seq: int) -> None:
        """Number the next message ``next_tx_seq`` (an earlier incarnation of this node wrote nothing at or
        above it). Only before anything was queued, and only below 2**62: a damaged file must not leave a
        path numbering so close to 2**64 that a header could no longer hold its sequence."""
        fresh = self.next_tx_seq == 1 and not self._send_queue and not self._written
        if fresh and 1 < next_tx_seq < _RESUME_TX_LIMIT:
            self.next_tx_seq = next_tx_seq

    def reset_sequences(self) -> list[AckedMessage]:
        """Peer restarted (GEN_NUM changed): seqs restart and unacked messages are flushed, not resent
        (``rds_conn_peer_gen_update``). Returns the flushed messages (the sender releases them)."""
        self.next_tx_seq = 1
        self._next_rx_seq = 0
        self.catchup_tx_seq = 0
        flushed = list(self._written)
        flushed.extend(m for m in self._send_queue if m.header.flags & HeaderFlag.RETRANSMITTED)
        self._written.clear()
        self._send_queue = deque(m for m in self._send_queue if not m.header.flags & HeaderFlag.RETRANSMITTED)
        return [self._release(msg) for msg in flushed]

    # -- receive side -------------------------------------------------------------------------------------
    def feed(self, data: bytes | bytearray | memoryview, now: float) -> list[Event]:
        """Bytes from TCP -> events.  Raises :class:`ProtocolError` (state ERROR) on a corrupt stream;
        events from messages that preceded the bad bytes are in the exception's ``partial``."""
        try:
            frames = self.framer.feed(data)
        except ProtocolError:
            self.state = PathState.ERROR
            raise
        events: list[Event] = []
        for frame in frames:
            self._on_frame(frame, now, events)
        err = self.framer.error
        if err is not None:
            self.state = PathState.ERROR
            err.partial = list(events)
            raise err
        return events

    def receive(self, header: RDSHeader, payload: bytes, now: float) -> list[Event]:
        """One whole message from a transport that delimits messages itself (RDS/IB reassembly): the same
        rules as :meth:`feed` after framing (congestion map, duplicate drop, ping/pong, delivery)."""
        events: list[Event] = []
        self._on_frame(Frame(header, payload), now, events)
        return events

    def _on_frame(self, frame: Frame, now: float, events: list[Event]) -> None:
        h, payload = frame
        if h.flags == HeaderFlag.CONG_BITMAP:
            if h.length != RDS_CONG_MAP_BYTES:
                events.append(CongMapDropped(h.length))
            else:
                events.append(CongMapReceived(CongestionMap.from_bytes(payload)))
            return
        if h.sequence < self._next_rx_seq and h.flags & HeaderFlag.RETRANSMITTED:
            events.append(DuplicateDropped(h.sequence))
            return
        self._next_rx_seq = h.sequence + 1
        if self.ping_enable and h.dport == 0:
            if h.sport == 0:
                return  # "ignore ping with 0 sport"
            queued = self._queue_pong(h.sport, peer_sport_idx(h.exthdr))
            events.append(PingReceived(h.sport, h.sequence, queued))
            if h.sport == RDS_FLAG_PROBE_PORT:
                self._handshake(h, events)
            return
        if h.dport == RDS_FLAG_PROBE_PORT and h.sport == 0:
            events.append(PongReceived(h.dport))
            self._handshake(h, events)
            return
        events.append(MessageReceived(h, payload, now))

    def _queue_pong(self, dport: int, sport_idx: bool) -> bool:
        # Pongs bypass the caller's queue limits (rds_send_pong has none) but are bounded by twice them.
        # ``max_pongs`` caps the pongs themselves: a peer that pings without reading the pongs cannot grow
        # this queue without limit (the kernel's rds_send_pong allocates one per ping)
        limit_m = self.max_queued_msgs
        if (limit_m is not None and self.queued_msgs >= 2 * limit_m) or (
            self.max_pongs is not None and self._pongs >= self.max_pongs
        ):
            self.pongs_dropped += 1
            return False
        exthdr = self._probe_exthdrs(sport_idx) if dport == RDS_FLAG_PROBE_PORT else ()
        self._enqueue(0, dport, b"", 0, exthdr)
        return True

    def _handshake(self, h: RDSHeader, events: list[Event]) -> None:
        self._npaths = negotiate_npaths(h.exthdr, self._npaths)
        self._with_sport_idx = peer_sport_idx(h.exthdr)
        events.append(NpathsNegotiated(self._npaths, self._with_sport_idx))
        gen = peer_gen_num(h.exthdr)
        if gen:
            if self._peer_gen and gen != self._peer_gen:
                old = self._peer_gen
                flushed = self.reset_sequences()
                events.append(PeerGenChanged(old, gen, tuple(flushed)))
            self._peer_gen = gen


def _row(m: _Out) -> UnackedMessage:
    h = m.header
    return UnackedMessage(h.sequence, h.length, h.sport, h.dport, h.flags)
