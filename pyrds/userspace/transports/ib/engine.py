"""One RDS/IB connection as a sans-IO state machine: work requests and completions in, events out.

Design choice (issue 9, step 1): the engine *reuses* :class:`pyrds.userspace.proto.PathEngine` for
everything RDS/IB shares with RDS/TCP -- sequence numbers (from 1, kept across reconnects), the retransmit
queue, requeueing unacked messages as RETRANSMITTED after a reconnect, the duplicate rule
(``seq < next_rx_seq`` and RETRANSMITTED: drop), ping/pong, the congestion map due after connect, the queue
limits -- through PathEngine's message-at-a-time calls (``next_message``, ``take_cong_map``, ``receive``,
``acked_seq``). PathEngine's TCP-only parts (the stream framer behind ``feed``, ``bytes_to_send`` and the
TCP-byte-count release ``acked_through``) are simply not called. That kept RDS/TCP's code path unchanged
(one helper, ``_release``, was factored out of it) instead of moving the shared logic into a new class both
would have to adopt. What is IB-only lives here and in :mod:`.frag` / :mod:`.reasm`:

Send (ib_send.c ``rds_ib_xmit``, send.c ``rds_send_xmit``): :meth:`IbEngine.poll_send` returns
:class:`~.frag.SendWR` items while the send ring (``send_wr`` slots) has room: first a pending ACK-only
frame (its own preallocated WR, outside the ring, at most one in flight, further requests coalesced and sent
after it completes), then the congestion map when due (sequence 0, flags exactly CONG_BITMAP, two 4 KiB
fragments), then queued messages. Each message gets ``h_ack`` = the last sequence received (piggyback; it also
satisfies a pending ACK request, as ``rds_ib_piggyb_ack`` does) and the checksum. ACK_REQUIRED as
``rds_send_xmit``: when the counters ``unacked_packets`` / ``unacked_bytes`` (zero on a new connection
object) are exhausted -- the message then sets them to ``max_unacked_packets`` (8) / ``max_unacked_bytes``
(16 MiB), every other message decrements them, so with the defaults messages 1, 10, 19, ... carry it --
and on every retransmission (``rds_send_path_reset``). A reset (``connection_lost``) refills the counters,
as ``rds_send_path_reset`` does, so after a reconnect only the retransmissions carry it at first. A WR is
signalled after ``max_unsignaled_wr`` unsignalled ones, on the last fragment of every message and when it
fills the ring;
SOLICITED is set on the last fragment (the kernel's receive CQ is armed for solicited completions only).
:meth:`IbEngine.send_complete` frees the ring up to a signalled wr_id (RC completes in order).

Receive (ib_recv.c ``rds_ib_process_recv``): :meth:`IbEngine.recv_complete` takes the bytes of one receive
completion (header then fragment, as scattered into a 48 + 4096 byte buffer). Fewer than 48 bytes, a bad
checksum (0 = none), a completion opcode other than RECV, a fragment header mismatch, a short fragment or an
over-long message drop the connection: the engine goes DOWN, counts ``ib_protocol_error`` and
``ib_drop_<reason>``, and raises :class:`~pyrds.userspace.proto.ProtocolError` (``reason``; ``partial`` holds
the events of that completion before the fault). ``h_ack`` is processed on every frame (a
:class:`~.events.MessagesAcked` event), ``h_credit`` is only recorded (flow control stays off as between
upstream kernels). ACK-only frames (ports 0, no payload) may arrive between fragments. A completed message
with ACK_REQUIRED makes the next :meth:`IbEngine.poll_send` return an ACK-only frame.

Connection setup (ib_cm.c): :meth:`IbEngine.connect` gives the REQ private data, :meth:`IbEngine.on_reply`
takes the REP's, :meth:`IbEngine.on_request` answers a REQ (accept with our REP private data, or reject with
the kernel's REJ consumer data), :meth:`IbEngine.established` brings the connection UP and applies the peer's
``ack_seq``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pyrds.constants import RDS_HEADER_SIZE, RDS_MAX_MSG_SIZE, ExtHeaderType, HeaderFlag
from pyrds.userspace.proto import (
    AckedMessage,
    CongestionMap,
    ExtHeader,
    PathEngine,
    PathState,
    ProtocolError,
    RDSHeader,
    cong_map_header,
)
from pyrds.userspace.proto.header import checksum_ok
from pyrds.userspace.transports.ib.events import IbEvent, MessagesAcked, RdmaCompleted, SequenceGap
from pyrds.userspace.transports.ib.frag import SendWR, WrKind, ack_frame, fragments, sealed_header
from pyrds.userspace.transports.ib.privdata import (
    REJ_CONSUMER_DATA,
    ConnectPrivate,
    IPAddress,
    negotiate,
    propose,
    reply_version,
)
from pyrds.userspace.transports.ib.reasm import Reassembler
from pyrds.userspace.transports.ib.wire import (
    ACK_WR_ID,
    MAX_RECV_WR,
    MAX_SEND_WR,
    MAX_UNACKED_BYTES,
    MAX_UNACKED_PACKETS,
    MAX_UNSIGNALED_WR,
    RDS_IB_SUPPORTED_PROTOCOLS,
    RECV_BUF_SIZE,
    WcOpcode,
)

__all__ = ["CmAnswer", "IbEngine"]


@dataclass(frozen=True, slots=True)
class CmAnswer:
    """The answer to a connect request: accept with ``private_data`` (the REP's) or reject with it (the REJ
    consumer data, always the kernel's ``int 1``); ``reason`` says why a request was rejected."""

    accept: bool
    private_data: bytes
    reason: str = ""


@dataclass(slots=True)
class _Tx:
    """The message whose work requests are being posted (``cp_xmit_rm``)."""

    kind: WrKind
    seq: int
    header: bytes
    frags: list[bytes]
    next: int = 0
    #: an RDMA op still to post before the first fragment (``cp_xmit_rdma_sent`` not set yet)
    rdma: Any = None
    #: the wr_id of a masked atomic's work request whose completion the fragments wait for (0: none)
    wait_wr: int = 0


class IbEngine:
    """State of one RDS/IB connection (laddr, faddr); see the module docstring."""

    def __init__(
        self,
        laddr: IPAddress,
        faddr: IPAddress,
        *,
        local_map: CongestionMap | None = None,
        ping_enable: bool = True,
        max_len: int = RDS_MAX_MSG_SIZE,
        max_queued_bytes: int | None = None,
        max_queued_msgs: int | None = None,
        max_pongs: int | None = None,
        send_wr: int = MAX_SEND_WR,
        recv_wr: int = MAX_RECV_WR,
        max_unsignaled_wr: int = MAX_UNSIGNALED_WR,
        max_unacked_packets: int = MAX_UNACKED_PACKETS,
        max_unacked_bytes: int = MAX_UNACKED_BYTES,
        tos: int = 0,
    ) -> None:
        if laddr.version != faddr.version:
            raise ValueError("laddr and faddr must be of the same family")
        if send_wr < 1 or recv_wr < 1 or max_unsignaled_wr < 0:
            raise ValueError("send_wr and recv_wr must be >= 1, max_unsignaled_wr >= 0")
        self.laddr = laddr
        self.faddr = faddr
        self.ipv6 = laddr.version == 6
        self.tos = tos
        self.path = PathEngine(
            str(laddr),
            str(faddr),
            0,
            local_map=local_map,
            ping_enable=ping_enable,
            max_len=max_len,
            max_queued_bytes=max_queued_bytes,
            max_queued_msgs=max_queued_msgs,
            max_pongs=max_pongs,
        )
        self.send_wr = send_wr
        self.recv_wr = recv_wr
        self.max_unsignaled_wr = max_unsignaled_wr
        self.max_unacked_packets = max_unacked_packets
        self.max_unacked_bytes = max_unacked_bytes
        #: kernel-named counters (ib_*, recv_drop_bad_checksum, send/recv_ack_required) and the userspace-only
        #: ``ib_protocol_error`` / ``ib_drop_<reason>`` / ``ib_bad_private_data`` / ``ib_connect_raced`` ...
        self.counters: Counter[str] = Counter()
        #: negotiated protocol version of the current connection (0: none)
        self.version = 0
        #: why the last connection was dropped by the engine ("" if it was not)
        self.drop_reason = ""
        #: h_credit values received (flow control is off: recorded, not used)
        self.credits_received = 0
        self._reasm = Reassembler(max_len)
        self._ack_next = 0  # i_ack_next: sequence of the last message completed on this connection
        self._ack_requested = False
        self._ack_in_flight = False
        self._unacked_packets = 0  # cp_unacked_packets: 0 on a new connection object
        self._unacked_bytes = 0
        self._tx: _Tx | None = None
        self._ring: deque[int] = deque()  # wr_ids posted on the send ring, not completed
        self._next_wr_id = 1
        self._unsignaled = max_unsignaled_wr
        self._recv_posted = 0
        self._peer_ack_seq = 0  # from the REQ, applied when the passive side is established
        self._rdma: dict[int, Any] = {}  # sequence -> the RDMA op of that message, until it is acked
        self._events: list[IbEvent] = []  # what poll_send decided besides work requests (take_events)

    # -- info ----------------------------------------------------------------------------------------------
    @property
    def state(self) -> PathState:
        return self.path.state

    @property
    def ack_next(self) -> int:
        """What this side acknowledges (``h_ack``): the last sequence completed on this connection."""
        return self._ack_next

    @property
    def last_rx_seq(self) -> int:
        """The highest sequence delivered from this peer, kept across reconnects (the REQ's ack_seq)."""
        return max(self.path.next_rx_seq - 1, 0)

    @property
    def ack_in_flight(self) -> bool:
        return self._ack_in_flight

    @property
    def ring_used(self) -> int:
        """Send ring slots posted and not completed."""
        return len(self._ring)

    @property
    def recv_posted(self) -> int:
        return self._recv_posted

    # -- connection setup (ib_cm.c) --------------------------------------------------------------------------
    def connect(self, now: float) -> bytes:
        """Active side: go CONNECTING and return the REQ private data (3.1, mask 0x0003, no credits)."""
        self.path.connecting(now)
        return propose(self.laddr, self.faddr, self.last_rx_seq, self.tos).pack()

    def on_reply(self, data: bytes | bytearray | memoryview, now: float) -> list[IbEvent]:
        """Active side: the REP arrived (rdma_cm ESTABLISHED) with ``data``. Adopt its version and come UP;
        malformed data or a version below 3.1 drops the attempt (:class:`ProtocolError`)."""
        try:
            rep = ConnectPrivate.parse(data, ipv6=self.ipv6)
            chosen = reply_version(rep)
        except ValueError as exc:
            self.counters["ib_bad_private_data"] += 1
            err = ProtocolError("bad_private_data", str(exc))
            self._drop(err, now)
            raise err from None
        self.version = chosen
        return self.established(now, rep.ack_seq)

    def on_request(self, data: bytes | bytearray | memoryview, now: float) -> CmAnswer:
        """Passive side: a REQ for this connection (ib_cm.c ``rds_ib_cm_handle_connect``). Version check,
        then: UP -> drop this connection and reject (the peer re-dials: ``ib_listen_closed_stale``);
        CONNECTING (our own REQ in flight) -> reject (``ib_connect_raced``); else accept with our private data
        and wait for :meth:`established`."""
        try:
            req = ConnectPrivate.parse(data, ipv6=self.ipv6)
        except ValueError as exc:
            self.counters["ib_bad_private_data"] += 1
            return CmAnswer(False, REJ_CONSUMER_DATA, f"bad_private_data: {exc}")
        chosen = negotiate(len(data), req.major, req.minor, req.minor_mask)
        if not chosen:
            self.counters["ib_bad_private_data"] += 1
            return CmAnswer(False, REJ_CONSUMER_DATA, f"incompatible version {req.major}.{req.minor}")
        if (req.saddr, req.daddr) != (self.faddr, self.laddr):
            self.counters["ib_bad_private_data"] += 1
            return CmAnswer(False, REJ_CONSUMER_DATA, f"addresses {req.saddr} -> {req.daddr} not this conn")
        if self.state == PathState.UP:
            self.counters["ib_listen_closed_stale"] += 1
            self.connection_lost(now)
            return CmAnswer(False, REJ_CONSUMER_DATA, "stale connection dropped")
        if self.state == PathState.CONNECTING:
            self.counters["ib_connect_raced"] += 1
            return CmAnswer(False, REJ_CONSUMER_DATA, "connect raced")
        self.path.connecting(now)
        self.version = chosen
        self._peer_ack_seq = req.ack_seq
        rep = ConnectPrivate(
            self.laddr,
            self.faddr,
            chosen >> 8,
            chosen & 0xFF,
            RDS_IB_SUPPORTED_PROTOCOLS,
            self.tos,
            self.last_rx_seq,
            0,
        )
        return CmAnswer(True, rep.pack())

    def established(self, now: float, peer_ack_seq: int | None = None) -> list[IbEvent]:
        """The QP is connected: come UP (unacked messages requeued as retransmissions, congestion map due),
        and release what the peer's ``ack_seq`` already acknowledges (passive side: the REQ's)."""
        ack = self._peer_ack_seq if peer_ack_seq is None else peer_ack_seq
        self._peer_ack_seq = 0
        self.path.connection_made(now)
        self._reset_connection_state()
        self.drop_reason = ""
        acked = self.path.acked_seq(ack) if ack else []
        self._forget_rdma(acked)
        return [MessagesAcked(tuple(acked))] if acked else []

    def connection_lost(self, now: float) -> None:
        """The QP is gone: a partial message is discarded (received) or restarted (sent); the ack policy's
        counters are refilled (``rds_send_path_reset``)."""
        self.path.connection_lost(now)
        self._reset_connection_state()
        self._unacked_packets = self.max_unacked_packets
        self._unacked_bytes = self.max_unacked_bytes
        self.version = 0

    def _reset_connection_state(self) -> None:
        self._reasm.reset()
        self._ack_next = 0
        self._ack_requested = False
        self._ack_in_flight = False
        self._tx = None
        self._ring.clear()
        self._unsignaled = self.max_unsignaled_wr
        self._recv_posted = 0

    def _drop(self, exc: ProtocolError, now: float) -> None:
        self.counters["ib_protocol_error"] += 1
        self.counters[f"ib_drop_{exc.reason}"] += 1
        self.drop_reason = str(exc)
        if self.state != PathState.DOWN:
            self.connection_lost(now)

    # -- send side -------------------------------------------------------------------------------------------
    def queue(
        self,
        sport: int,
        dport: int,
        payload: bytes,
        extra_flags: int = 0,
        exthdr: tuple[ExtHeader, ...] | list[ExtHeader] | None = None,
        rdma: Any = None,
    ) -> int:
        """Queue a message (any state: it goes out once UP); returns its sequence number. ``extra_flags``
        may carry ACK_REQUIRED (the core sets it while a socket's send buffer is half full). ``rdma``: an
        RDMA op whose work request goes out right before the message's first SEND; such a message is never
        retransmitted (:meth:`take_events`)."""
        seq = self.path.queue(sport, dport, payload, extra_flags, exthdr)
        if rdma is not None:
            self._rdma[seq] = rdma
        return seq

    def cancel_many(self, seqs: Collection[int]) -> list[AckedMessage]:
        """``rds_send_drop_to`` for the messages ``seqs``: off the send queue (never posted) or the
        retransmit queue (never retransmitted), their RDMA ops forgotten so they are not posted
        (:meth:`PathEngine.cancel_many`: one pass, unknown sequence numbers ignored). Fragments of one posted
        already (the message being posted now, ``cp_xmit_rm``) still go out, as the kernel's xmit keeps its
        own reference. Returns what the path released."""
        released = self.path.cancel_many(seqs)
        self._forget_rdma(released)
        return released

    def _forget_rdma(self, acked: list[Any]) -> None:
        if self._rdma:
            for m in acked:
                self._rdma.pop(m.seq, None)

    def send_ping(self, sport: int) -> int:
        return self.path.send_ping(sport)

    def queue_cong_map(self) -> None:
        """Send ``path.local_map`` before the next message (coalesced like ``c_map_queued``)."""
        self.path.queue_cong_map()

    def poll_send(self) -> list[SendWR]:
        """Work requests to post now, in order (empty when not UP or nothing fits)."""
        if self.state != PathState.UP:
            return []
        out: list[SendWR] = []
        if self._ack_requested and self._ack_in_flight:
            self.counters["ib_ack_send_delayed"] += 1  # rds_ib_attempt_ack: the one ACK WR is in flight
        if self._ack_requested and not self._ack_in_flight:
            self._ack_requested = False
            self._ack_in_flight = True
            self.counters["ib_ack_sent"] += 1
            out.append(SendWR(ACK_WR_ID, WrKind.ACK, ack_frame(self._ack_next), b"", True, True))
        while len(self._ring) < self.send_wr:
            tx = self._tx if self._tx is not None else self._next_tx()
            if tx is None:
                break
            self._tx = tx
            while (tx.rdma is not None or tx.next < len(tx.frags)) and len(self._ring) < self.send_wr:
                if tx.wait_wr:
                    break
                if tx.rdma is not None:
                    out.append(self._post_rdma(tx))
                    continue
                out.append(self._post(tx))
            if tx.wait_wr:
                break  # a masked atomic's chain runs: nothing after it goes out before it ends
            if tx.next == len(tx.frags) and tx.rdma is None:
                self._tx = None
        else:
            if self._tx is not None:
                self.counters["ib_tx_ring_full"] += 1  # the rest is posted after send completions
        return out

    def _post(self, tx: _Tx) -> SendWR:
        index = tx.next
        tx.next += 1
        last = tx.next == len(tx.frags)
        # also the WR that fills the ring: without a completion nothing would ever free it (only matters
        # for rings smaller than max_unsignaled_wr + 1; the kernel's 256 never is)
        if self._unsignaled == 0 or last or len(self._ring) + 1 == self.send_wr:
            self._unsignaled = self.max_unsignaled_wr
            signaled = True
        else:
            self._unsignaled -= 1
            signaled = False
        wr_id = self._next_wr_id
        self._next_wr_id += 1
        self._ring.append(wr_id)
        frag = tx.frags[index]
        return SendWR(wr_id, tx.kind, tx.header, frag, signaled, last, tx.seq, index, len(tx.frags))

    def _post_rdma(self, tx: _Tx) -> SendWR:
        """``rds_ib_xmit_rdma``: one signalled RDMA WR on the ring (its completion carries the status). A
        masked atomic (``op.masked``: the driver emulates it with a chain of plain atomics under this wr_id)
        holds the message's fragments until :meth:`send_complete` of this wr_id, so the target sees the
        final word when the message arrives (a plain op relies on RC ordering instead)."""
        op, tx.rdma = tx.rdma, None
        self._unsignaled = self.max_unsignaled_wr
        wr_id = self._next_wr_id
        self._next_wr_id += 1
        self._ring.append(wr_id)
        self.counters["ib_tx_rdma_wr"] += 1
        if op.atomic and op.masked:
            tx.wait_wr = wr_id
        nfrags = len(tx.frags)
        return SendWR(wr_id, WrKind.RDMA, b"", b"", True, False, tx.seq, 0, nfrags, rdma=op, alone=not nfrags)

    def take_events(self) -> list[IbEvent]:
        """Events of :meth:`poll_send`: retransmissions with an RDMA op dropped (released, and the op's
        notification RDS_RDMA_DROPPED)."""
        out, self._events = self._events, []
        return out

    def _drop_rdma_retransmissions(self) -> None:
        """``rds_send_xmit``: "we never retransmit messages with RDMA ops" (an RDMA to a bad key moved the
        whole QP to error; the kernel drops the message and reports RDS_RDMA_DROPPED)."""
        while True:
            seq = self.path.next_retransmission()
            if not seq or seq not in self._rdma:
                return
            op = self._rdma.pop(seq)
            self.counters["ib_rdma_retrans_dropped"] += 1
            self._events.append(MessagesAcked((self.path.drop_next(),)))
            self._events.append(RdmaCompleted(op, 3))  # RDS_RDMA_DROPPED

    def _next_tx(self) -> _Tx | None:
        if self._rdma:
            self._drop_rdma_retransmissions()
        if self.path.take_cong_map():
            header = dataclasses.replace(cong_map_header(), ack=self._piggyback())
            return _Tx(WrKind.CONG, 0, sealed_header(header), fragments(self.path.local_map.to_bytes()))
        picked = self.path.next_message()
        if picked is None:
            return None
        header, payload = picked
        # rds_send_xmit's ACK_REQUIRED accounting, done when it picks a message (silent or not)
        flags = header.flags
        if flags & HeaderFlag.RETRANSMITTED:
            flags |= HeaderFlag.ACK_REQUIRED
        if self._unacked_packets == 0 or self._unacked_bytes < header.length:
            flags |= HeaderFlag.ACK_REQUIRED
            self._unacked_packets = self.max_unacked_packets
            self._unacked_bytes = self.max_unacked_bytes
            self.counters["send_ack_required"] += 1
        else:
            self._unacked_packets -= 1
            self._unacked_bytes -= header.length
        rdma = self._rdma.get(header.sequence)
        if rdma is not None and _silent(header, payload, rdma):
            # rds_send_xmit: "if there are exclusively attached silent ops, we skip the hdr/data send": the op
            # is posted, no SEND (nor the piggybacked ack that rds_ib_xmit would carry); the sequence number
            # stays used, and the ack of a later message releases it
            self.counters["ib_tx_silent"] += 1
            tx = _Tx(WrKind.DATA, header.sequence, b"", [])
            tx.rdma = rdma
            return tx
        wire = dataclasses.replace(header, flags=flags, ack=self._piggyback())
        tx = _Tx(WrKind.DATA, header.sequence, sealed_header(wire), fragments(payload))
        tx.rdma = rdma
        return tx

    def _piggyback(self) -> int:
        """``rds_ib_piggyb_ack``: the ack for a data frame; a pending ACK request counts as answered."""
        if self._ack_requested:
            self._ack_requested = False
            self.counters["ib_ack_send_piggybacked"] += 1
        return self._ack_next

    def send_complete(self, wr_id: int) -> None:
        """A send completion (success) for signalled ``wr_id``: the ACK WR is free again, or the ring up to
        ``wr_id`` is (unsignalled WRs before it completed too)."""
        if wr_id == ACK_WR_ID:
            if not self._ack_in_flight:
                raise ValueError("ACK work request completed but none was posted")
            self._ack_in_flight = False
            return
        if wr_id not in self._ring:
            raise ValueError(f"wr_id {wr_id} is not on the send ring")
        while self._ring and self._ring[0] <= wr_id:
            self._ring.popleft()
        if self._tx is not None and self._tx.wait_wr == wr_id:
            self._tx.wait_wr = 0  # the masked atomic's chain ended: its message may go

    # -- receive side ----------------------------------------------------------------------------------------
    def recv_to_post(self) -> int:
        """Receive buffers (48 + 4096 bytes each) to post now: the whole ring once UP, then a refill when at
        most half of it is still posted (``rds_ib_ring_low``)."""
        if self.state != PathState.UP or self._recv_posted > self.recv_wr // 2:
            return 0
        n = self.recv_wr - self._recv_posted
        self._recv_posted = self.recv_wr
        return n

    def recv_complete(
        self, data: bytes | bytearray | memoryview, now: float, opcode: int = WcOpcode.RECV
    ) -> list[IbEvent]:
        """One successful receive completion carrying ``data`` (its ``byte_len`` bytes). Completions after
        the connection went down (flushes) are ignored."""
        if self.state != PathState.UP:
            return []
        self._recv_posted = max(self._recv_posted - 1, 0)
        events: list[IbEvent] = []
        try:
            self._recv(memoryview(data).cast("B"), now, opcode, events)
        except ProtocolError as exc:
            exc.partial = list(events)
            self._drop(exc, now)
            raise
        return events

    def _recv(self, view: memoryview, now: float, opcode: int, events: list[IbEvent]) -> None:
        if opcode != WcOpcode.RECV:
            raise ProtocolError("bad_opcode", f"receive completion opcode {opcode}")
        if len(view) < RDS_HEADER_SIZE:
            raise ProtocolError("short_frame", f"{len(view)} < {RDS_HEADER_SIZE} bytes")
        if len(view) > RECV_BUF_SIZE:
            raise ProtocolError("long_frame", f"{len(view)} > {RECV_BUF_SIZE} bytes")
        raw = view[:RDS_HEADER_SIZE]
        if not checksum_ok(raw):
            self.counters["recv_drop_bad_checksum"] += 1
            raise ProtocolError("bad_checksum", "corrupted header")
        h = RDSHeader.decode(raw)
        acked = self.path.acked_seq(h.ack)
        if acked:
            self._forget_rdma(acked)
            events.append(MessagesAcked(tuple(acked)))
        if h.credit:
            self.credits_received += h.credit
        data = view[RDS_HEADER_SIZE:]
        if h.sport == 0 and h.dport == 0 and len(data) == 0:
            self.counters["ib_ack_received"] += 1
            return
        self.counters["ib_rx_frames"] += 1  # (the kernel's ib_rx_total_frags counts buffer allocations)
        done = self._reasm.feed(h, data)
        if done is None:
            return
        self.counters["ib_rx_messages"] += 1
        header, payload = done
        if 0 < self.path.next_rx_seq < header.sequence:
            events.append(SequenceGap())
        events.extend(self.path.receive(header, payload, now))
        if header.flags != HeaderFlag.CONG_BITMAP:
            self._ack_next = header.sequence
        if header.flags & HeaderFlag.ACK_REQUIRED:
            self.counters["recv_ack_required"] += 1
            self._ack_requested = True


def _silent(header: RDSHeader, payload: bytes, rdma: Any) -> bool:
    """``rds_send_xmit``: a message without payload whose one op (RDMA or atomic) has RDS_RDMA_SILENT and
    that carries no cookie (``m_rdma_cookie``, sent as RDS_EXTHDR_RDMA_DEST) has no data op: only the op
    goes out."""
    return bool(rdma.silent) and not payload and all(x.type != ExtHeaderType.RDMA_DEST for x in header.exthdr)
