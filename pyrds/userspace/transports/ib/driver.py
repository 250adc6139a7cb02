"""The I/O driver of one RDS/IB connection: rdma_cm and an RC queue pair around :class:`~.engine.IbEngine`.

An :class:`IbConnection` owns one rdma_cm id and, once the id is bound to a device, one
:class:`~.verbs.QueuePair` (external QP, one CQ, a completion channel). It never blocks: the CM channel's
and the completion channel's fds are non-blocking and registered with an :class:`FdLoop`; each readiness
callback drains what is pending.

Active side (ib_cm.c ``rds_ib_conn_path_connect``): :meth:`IbConnection.dial` takes the REQ private data from
the engine (which goes CONNECTING at once, so a crossing REQ is rejected as the kernel does), resolves the
address and the route (5 s each, ``RDS_RDMA_RESOLVE_TIMEOUT_MS``), creates the QP (RESET -> INIT), and
connects to port 18634. On CONNECT_RESPONSE the REP's private data goes to :meth:`IbEngine.on_reply`; the
receive ring is posted, the QP goes RTR -> RTS and ``rdma_establish`` sends the RTU (the passive kernel
sends its congestion map as soon as it sees that, so the buffers must be there first).

Passive side: :meth:`IbConnection.accept` is given a CONNECT_REQUEST (the listener, :class:`IbListener`, only
dispatches) and the engine's :class:`~.engine.CmAnswer`: a reject sends the REJ consumer data and destroys the
id; an accept creates the QP, brings it to RTS, posts the receive ring and accepts with the REP private data.
The connection comes UP on ESTABLISHED -- or on the first receive completion, whichever the loop sees first
(data can overtake the RTU; ib_cm turns the first packet into ESTABLISHED the same way).

Rings: receive slots are all posted once per connection before the peer can send; the engine's
:meth:`IbEngine.recv_to_post` then says how many to repost (it counts the ring full when it comes UP, which
is exactly what is posted); none is reposted while a receiving socket over its cap holds the connection
(:meth:`IbConnection.hold_receive`). Send slot of a work request: ``wr_id % send_wr`` (the engine numbers them
consecutively and never has more than ``send_wr`` outstanding); the ACK frame has its own slot ``send_wr``.

RDMA and atomic ops (``stack.rdma.RdmaOp``): one signalled work request each, on the ring slot the engine
gave it, with a registered bounce buffer for the local side. A masked atomic (verbs and rdma_rxe have none) is
a chain of plain atomics under that one wr_id (``stack.rdma.MaskedAtomic``: a fetch-and-add of 0 to read the
word, then compare-and-swaps, each posted when the previous completed); only its end is reported
(:class:`~.events.RdmaCompleted`) and given to :meth:`IbEngine.send_complete`, which lets the op's message go
out. Counters: ``ib_atomic_masked`` (ops emulated), ``ib_atomic_masked_retry`` (a swap posted again after one
lost a race with another atomic on the word), ``ib_atomic_masked_gave_up`` (ended RDS_RDMA_OTHER_ERROR after
``MAX_MASKED_SWAPS`` swaps); ``ib_atomic_fadd`` / ``ib_atomic_cswp`` once per op as the kernel's.

Anything unexpected drops the connection (and counts, in :attr:`IbConnection.counters`): a completion with an
error status, a receive completion naming a slot that is not posted or longer than a buffer, a send
completion the engine does not know, a frame the engine rejects
(:class:`~pyrds.userspace.proto.ProtocolError`), a failing verbs call, and the CM events that drop a kernel
connection (errors, REJECTED, DISCONNECTED, DEVICE_REMOVAL, ADDR_CHANGE, TIMEWAIT_EXIT). The owner
(:class:`ConnOwner`) hears about every engine event and about the end of the connection; reconnecting is
its business.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from pyrds.userspace.proto import PathState, ProtocolError
from pyrds.userspace.stack.rdma import ATOMIC_CSWP, ATOMIC_FADD, AtomicStep, MaskedAtomic
from pyrds.userspace.transports.ib.engine import CmAnswer, IbEngine
from pyrds.userspace.transports.ib.events import IbEvent, RdmaCompleted
from pyrds.userspace.transports.ib.frag import SendWR, WrKind
from pyrds.userspace.transports.ib.verbs import (
    CmChannel,
    CmEvent,
    CmEventKind,
    CmId,
    Completion,
    ConnParams,
    MemoryRegion,
    QpConfig,
    QueuePair,
    Verbs,
    VerbsError,
    WcOpcode,
    WcStatus,
)
from pyrds.userspace.transports.ib.wire import ACK_WR_ID, RDS_IB_PORT, RECV_BUF_SIZE

__all__ = [
    "ConnOwner",
    "ConnState",
    "FdLoop",
    "IbConnection",
    "IbListener",
    "RESOLVE_TIMEOUT_MS",
    "reject_request",
]

log = logging.getLogger("pyrds.userspace.ib")

#: ``RDS_RDMA_RESOLVE_TIMEOUT_MS``
RESOLVE_TIMEOUT_MS = 5000
#: the send completions of an RDMA or atomic op (each op's work request is signalled)
_RDMA_OPCODES = frozenset({WcOpcode.RDMA_WRITE, WcOpcode.RDMA_READ, WcOpcode.COMP_SWAP, WcOpcode.FETCH_ADD})


def _opcode_of(op: Any) -> int:
    """The completion opcode the work request of ``op`` (``stack.rdma.RdmaOp``) gives."""
    if op.atomic == ATOMIC_FADD:
        return WcOpcode.FETCH_ADD
    if op.atomic == ATOMIC_CSWP:
        return WcOpcode.COMP_SWAP
    return WcOpcode.RDMA_WRITE if op.write else WcOpcode.RDMA_READ


@dataclass(slots=True)
class _PostedRdma:
    """An RDMA or atomic op whose work request is posted: its registered bounce buffer, the completion
    opcode expected, and for a masked atomic the chain of plain atomics doing it (one WR in flight at a
    time, all under the op's wr_id)."""

    op: Any
    bounce: MemoryRegion
    opcode: int
    chain: MaskedAtomic | None = None
    #: no SEND of the op's message follows (a silent op's)
    alone: bool = False


#: CM events that end a connection (rdma_transport.c ``rds_rdma_cm_event_handler_cmn``)
_DROP_EVENTS = frozenset(
    {
        CmEventKind.ADDR_ERROR,
        CmEventKind.ROUTE_ERROR,
        CmEventKind.CONNECT_ERROR,
        CmEventKind.UNREACHABLE,
        CmEventKind.REJECTED,
        CmEventKind.DISCONNECTED,
        CmEventKind.DEVICE_REMOVAL,
        CmEventKind.ADDR_CHANGE,
        CmEventKind.TIMEWAIT_EXIT,
    }
)


class FdLoop(Protocol):
    """What the driver needs of an event loop: read readiness of an fd, and timers."""

    def add_reader(self, fd: int, cb: Callable[[], None]) -> None: ...
    def remove_reader(self, fd: int) -> None: ...
    def call_later(self, delay: float, cb: Callable[[], None]) -> None: ...


class ConnOwner(Protocol):
    """Who an :class:`IbConnection` reports to."""

    def conn_events(self, conn: IbConnection, events: list[IbEvent]) -> None:
        """The engine produced ``events`` (messages, pings, acks ...)."""

    def conn_closed(self, conn: IbConnection, reason: str) -> None:
        """The connection is gone (its engine is DOWN); ``reason`` says why."""


class ConnState(enum.Enum):
    RESOLVING_ADDR = "resolving-addr"
    RESOLVING_ROUTE = "resolving-route"
    CONNECTING = "connecting"  # active: REQ sent, waiting for the REP
    ACCEPTING = "accepting"  # passive: REP sent, waiting for the RTU
    UP = "up"
    CLOSED = "closed"


class IbConnection:
    """One RC connection driving ``engine``; see the module docstring."""

    def __init__(
        self,
        engine: IbEngine,
        loop: FdLoop,
        owner: ConnOwner,
        clock: Callable[[], float],
        *,
        active: bool,
    ) -> None:
        self.engine = engine
        self.loop = loop
        self.owner = owner
        self.clock = clock
        self.active = active
        self.state = ConnState.RESOLVING_ADDR if active else ConnState.ACCEPTING
        self.counters: Counter[str] = Counter()
        self.close_reason = ""
        self.cmid: CmId | None = None
        self.qp: QueuePair | None = None
        self.channel: CmChannel | None = None  # active side only: the id's own event channel
        self.port = RDS_IB_PORT
        self.timeout_ms = RESOLVE_TIMEOUT_MS
        self._req = b""
        self._free_recv: list[int] = []
        self._posted = [False] * engine.recv_wr
        self._qp_fd = -1
        self._ch_fd = -1
        self._nposted = 0
        #: (source, destination) GIDs and the device's max_sge, read when the connection comes UP
        self.gids: tuple[bytes, bytes] = (bytes(16), bytes(16))
        self.device_max_sge = 0
        #: RDMA work requests posted and not completed, by wr_id
        self._rdma_wrs: dict[int, _PostedRdma] = {}
        #: statuses of completed silent RDMA ops, due when a later SEND completes (dropped with the
        #: connection, as the kernel's flushed ring: the op's message then ends RDS_RDMA_DROPPED)
        self._deferred: list[IbEvent] = []
        #: the receiving sockets (their (address, port)) over their receive cap that hold this connection:
        #: while any does, no receive buffer is posted again (:meth:`hold_receive`)
        self.rx_holds: set[tuple[Any, int]] = set()

    def __repr__(self) -> str:
        side = "active" if self.active else "passive"
        return f"<IbConnection {self.engine.laddr}->{self.engine.faddr} {side} {self.state.value}>"

    # -- setup ----------------------------------------------------------------------------------------------
    @classmethod
    def dial(
        cls,
        verbs: Verbs,
        engine: IbEngine,
        loop: FdLoop,
        owner: ConnOwner,
        clock: Callable[[], float],
        *,
        port: int = RDS_IB_PORT,
        timeout_ms: int = RESOLVE_TIMEOUT_MS,
    ) -> IbConnection:
        """Start an active connection from ``engine.laddr`` to ``engine.faddr``:``port`` (the engine must be
        DOWN). Failures show up later as :meth:`ConnOwner.conn_closed`, never as an exception here."""
        conn = cls(engine, loop, owner, clock, active=True)
        conn.port = port
        conn.timeout_ms = timeout_ms
        conn._req = engine.connect(clock())
        try:
            conn.channel = verbs.create_channel()
            conn._ch_fd = conn.channel.fileno()
            loop.add_reader(conn._ch_fd, conn._on_channel)
            conn.cmid = conn.channel.create_id()
            conn.cmid.resolve_addr(str(engine.laddr), str(engine.faddr), port, timeout_ms)
        except VerbsError as exc:
            conn._fail("dial", exc)
        return conn

    @classmethod
    def accept(
        cls,
        request: CmId,
        answer: CmAnswer,
        engine: IbEngine,
        loop: FdLoop,
        owner: ConnOwner,
        clock: Callable[[], float],
    ) -> IbConnection | None:
        """Answer a CONNECT_REQUEST as the engine decided (``answer`` from :meth:`IbEngine.on_request`):
        None after a reject, else the new connection (ACCEPTING; its CM events come from the listener)."""
        if not answer.accept:
            reject_request(request, answer.private_data)
            return None
        conn = cls(engine, loop, owner, clock, active=False)
        conn.cmid = request
        try:
            conn._create_qp()
            assert conn.qp is not None
            conn.qp.to_rts()
            conn._post_ring()
            request.accept(ConnParams(answer.private_data))
        except VerbsError as exc:
            conn._fail("accept", exc)
        return conn

    def _create_qp(self) -> None:
        assert self.cmid is not None
        self.qp = self.cmid.create_qp(
            QpConfig(send_slots=self.engine.send_wr + 1, recv_slots=self.engine.recv_wr)
        )
        self._qp_fd = self.qp.fileno()
        self.loop.add_reader(self._qp_fd, self._on_cq)
        # the receive buffers are allocated (registered) with the QP: the kernel counts its receive fragment
        # allocations as ib_rx_total_frags (ib_recv.c rds_ib_refill_one_frag)
        self.counters["ib_rx_total_frags"] += self.engine.recv_wr
        self.qp.to_init()

    def _post_ring(self) -> None:
        """Post every receive buffer (before the peer can send: accept / establish)."""
        assert self.qp is not None
        for slot in range(self.engine.recv_wr):
            self.qp.post_recv(slot)
            self._posted[slot] = True
        self._nposted = self.engine.recv_wr
        self._free_recv.clear()
        # the one fill of a new connection's ring (the kernel: rds_ib_recv_path, the worker run at connect)
        self.counters["ib_rx_refill_from_thread"] += 1

    # -- CM events ------------------------------------------------------------------------------------------
    def _on_channel(self) -> None:
        while self.channel is not None and self.state != ConnState.CLOSED:
            try:
                ev = self.channel.get_event()
            except VerbsError as exc:
                self._fail("cm event", exc)
                return
            if ev is None:
                return
            self.handle_cm(ev)

    def handle_cm(self, ev: CmEvent) -> None:
        """One CM event of this connection's id (from its own channel or, passive, from the listener's)."""
        if self.state == ConnState.CLOSED:
            return
        kind = ev.kind
        self.counters[f"cm_{kind.name.lower()}"] += 1
        try:
            if kind == CmEventKind.ADDR_RESOLVED and self.state == ConnState.RESOLVING_ADDR:
                assert self.cmid is not None
                self.cmid.resolve_route(self.timeout_ms)
                self.state = ConnState.RESOLVING_ROUTE
            elif kind == CmEventKind.ROUTE_RESOLVED and self.state == ConnState.RESOLVING_ROUTE:
                assert self.cmid is not None
                self._create_qp()
                self.cmid.connect(ConnParams(self._req))
                self.state = ConnState.CONNECTING
            elif kind == CmEventKind.CONNECT_RESPONSE and self.state == ConnState.CONNECTING:
                self._on_reply(ev.private_data)
            elif kind == CmEventKind.ESTABLISHED and self.state == ConnState.ACCEPTING:
                self._come_up()
            elif kind == CmEventKind.ESTABLISHED and self.state == ConnState.UP:
                pass  # already up from the first receive completion
            elif kind in _DROP_EVENTS:
                self.close(kind.name.lower())
            else:
                self.counters["cm_unexpected_event"] += 1
                log.debug("%r: unexpected CM event %s (raw %d)", self, kind.name, ev.raw)
        except VerbsError as exc:
            self._fail(kind.name.lower(), exc)

    def _on_reply(self, private_data: bytes) -> None:
        try:
            events = self.engine.on_reply(private_data, self.clock())
        except ProtocolError as exc:
            self.counters["ib_bad_reply"] += 1
            self.close(f"bad reply: {exc}")
            return
        assert self.qp is not None and self.cmid is not None
        self._post_ring()
        self.qp.to_rts()
        self.cmid.establish()
        self._take_ring()
        self.state = ConnState.UP
        self.counters["ib_connected"] += 1
        self._report(events)
        self._pump()

    def _take_ring(self) -> None:
        """The engine just came UP and asks for the whole ring: it is posted already. Also the moment to
        read what RDS_INFO_IB_CONNECTIONS shows of the path and the device (the kernel reads them then too:
        the GIDs of an UP connection, ``rds_ibdev->max_sge``)."""
        want = self.engine.recv_to_post()
        if want != sum(self._posted):
            self.counters["ib_recv_ring_mismatch"] += 1
        if self.qp is not None:
            try:  # only shown in the info table: never a reason to drop the connection
                src, dst = self.qp.gids()
                self.gids = (_gid(src), _gid(dst))
                self.device_max_sge = max(0, int(self.qp.device_max_sge))
            except VerbsError as exc:
                log.debug("%r: GIDs / device attributes unreadable: %s", self, exc)

    def _come_up(self) -> None:
        events = self.engine.established(self.clock())
        self._take_ring()
        self.state = ConnState.UP
        self.counters["ib_connected"] += 1
        self._report(events)
        self._pump()

    # -- completions ----------------------------------------------------------------------------------------
    def _closed(self) -> bool:
        return self.state == ConnState.CLOSED

    def _on_cq(self) -> None:
        if self.state == ConnState.CLOSED or self.qp is None:
            return
        # one handler both takes the completion event and polls (the kernel's CQ event handler and its
        # tasklet; one CQ here for sends and receives)
        self.counters["ib_evt_handler_call"] += 1
        self.counters["ib_tasklet_call"] += 1
        try:
            wcs = self.qp.completions()
        except VerbsError as exc:
            self._fail("cq", exc)
            return
        for wc in wcs:
            if self._closed():
                return
            self._completion(wc)
        self._pump(from_cq=True)

    def _completion(self, wc: Completion) -> None:
        if wc.status != WcStatus.SUCCESS:
            name = "flushed" if wc.status == WcStatus.WR_FLUSH_ERR else f"wc status {wc.status}"
            self.counters["ib_wc_error"] += 1
            posted = None if wc.is_recv else self._rdma_wrs.pop(wc.wr_id, None)
            if posted is not None and wc.status != WcStatus.WR_FLUSH_ERR:
                self._count_atomic(posted.op)
                # rds_ib_send_complete: a remote access error is REMOTE_ERROR, anything else OTHER_ERROR
                # (also when it ends a masked atomic's chain, in whichever step)
                self.counters["ib_rdma_wc_error"] += 1
                status = 1 if wc.status == WcStatus.REM_ACCESS_ERR else 4
                posted.bounce.close()
                self._report([RdmaCompleted(posted.op, status)])
            self.close(f"{'receive' if wc.is_recv else 'send'} completion {name}")
            return
        if wc.is_recv:
            self.counters["ib_rx_cq_event"] += 1
            self._recv_completion(wc)
            return
        self.counters["ib_tx_cq_event"] += 1
        if wc.opcode in _RDMA_OPCODES:
            posted = self._rdma_wrs.pop(wc.wr_id, None)
            if posted is None or wc.opcode != posted.opcode:
                self.counters["ib_bad_completion"] += 1
                self.close(f"RDMA completion (opcode {wc.opcode}) for wr_id {wc.wr_id}, not posted")
                return
            op, bounce = posted.op, posted.bounce
            try:
                data = b"" if op.write else bounce.read(0, op.nbytes)
                if posted.chain is not None:
                    step = posted.chain.advance(int.from_bytes(data[:8], sys.byteorder))
                    if step is not None:
                        self._post_step(wc.wr_id, posted, step)
                        return  # the op's WR slot stays taken: its message waits for the chain's end
                    status, data = _chain_outcome(posted.chain)
                    if status:
                        self.counters["ib_atomic_masked_gave_up"] += 1
                else:
                    status = 0
            except VerbsError as exc:
                _close_quietly(bounce)
                self._fail("RDMA read-back" if posted.chain is None else "masked atomic step", exc)
                return
            self._count_atomic(op)
            bounce.close()
            if posted.alone and not op.atomic and op.notify:
                # rds_ib_xmit_rdma leaves a NOTIFY_ME READ/WRITE unsignalled: its status comes when a later
                # signalled WR of the ring completes, normally its message's SEND; a silent op has none, so
                # it waits for the next message's
                self.counters["ib_rdma_notify_deferred"] += 1
                self._deferred.append(RdmaCompleted(op, status, data))
            else:
                self._report([RdmaCompleted(op, status, data)])
            if self._closed():
                return
        elif wc.opcode != WcOpcode.SEND:
            self.counters["ib_bad_completion"] += 1
            self.close(f"send completion with opcode {wc.opcode}")
            return
        try:
            self.engine.send_complete(wc.wr_id)
        except ValueError as exc:
            self.counters["ib_bad_completion"] += 1
            self.close(f"bad send completion: {exc}")
            return
        if self._deferred and wc.opcode == WcOpcode.SEND and wc.wr_id != ACK_WR_ID:
            # a message's SEND completed (not the ACK WR, whose completion the kernel handles apart from the
            # ring): the deferred statuses of the silent ops posted before it are due
            deferred, self._deferred = self._deferred, []
            self._report(deferred)

    def _recv_completion(self, wc: Completion) -> None:
        assert self.qp is not None
        slot = wc.wr_id
        if not 0 <= slot < len(self._posted) or not self._posted[slot]:
            self.counters["ib_bad_completion"] += 1
            self.close(f"receive completion for slot {slot}, not posted")
            return
        if not 0 <= wc.byte_len <= RECV_BUF_SIZE:
            self.counters["ib_protocol_error"] += 1
            self.counters["ib_drop_long_frame"] += 1
            self.close(f"protocol error: receive of {wc.byte_len} bytes")
            return
        data = self.qp.read_recv(slot, wc.byte_len)
        if self.state == ConnState.ACCEPTING:
            self._come_up()  # data overtook the RTU; the engine now counts the whole ring posted
        # the buffer is free (to be reposted when the engine asks) only now: before coming UP it was part of
        # the ring the engine counts as posted
        self._posted[slot] = False
        self._nposted -= 1
        self._free_recv.append(slot)
        if self._nposted == 0:
            self.counters["ib_rx_ring_empty"] += 1
        if self.state != ConnState.UP:
            self.counters["ib_recv_not_up"] += 1
            return
        try:
            events = self.engine.recv_complete(data, self.clock(), wc.opcode)
        except ProtocolError as exc:
            self._report(cast(list[IbEvent], exc.partial))
            self.close(f"protocol error: {exc}")
            return
        self._report(events)

    # -- send / refill --------------------------------------------------------------------------------------
    def kick(self) -> None:
        """Post what the engine has to send (after a message was queued)."""
        self._pump()

    def _pump(self, from_cq: bool = False) -> None:
        if self.state != ConnState.UP or self.qp is None:
            return
        try:
            want = 0 if self.rx_holds else self.engine.recv_to_post()
            if want > len(self._free_recv):
                self.counters["ib_recv_ring_mismatch"] += 1
            if from_cq and want and self._free_recv:
                self.counters["ib_rx_refill_from_cq"] += 1
            for _ in range(min(want, len(self._free_recv))):
                slot = self._free_recv.pop()
                self.qp.post_recv(slot)
                self._posted[slot] = True
                self._nposted += 1
            send_wr = self.engine.send_wr
            for wr in self.engine.poll_send():
                if wr.kind == WrKind.RDMA:
                    self._post_rdma(wr)
                    continue
                slot = send_wr if wr.wr_id == ACK_WR_ID else wr.wr_id % send_wr
                self.qp.post_send(slot, wr.wr_id, wr.data, wr.signaled, wr.solicited)
                self.counters["ib_tx_wr"] += 1
            self._report(self.engine.take_events())
        except VerbsError as exc:
            self._fail("post", exc)

    def hold_receive(self, sock: tuple[Any, int]) -> None:
        """The socket ``sock`` (address, port) went over its receive cap with a message of this connection:
        until :meth:`release_receive` of every such socket, the receive ring is not refilled. The buffers
        posted still fill (at most the ring's worth of frames more is delivered); then the peer's SENDs meet
        no buffer, RC answers them with RNR NAKs and the peer's QP retries them without end (rnr_retry 7),
        so the peer's sends on this connection stall instead of queueing here: the IB counterpart of RDS/TCP
        not reading its socket (TCP's closed window)."""
        if not self.rx_holds:
            self.counters["ib_recv_hold"] += 1
            log.info("%r: a receiving socket is over its cap; no buffer reposted until it drains", self)
        self.rx_holds.add(sock)

    def release_receive(self, sock: tuple[Any, int]) -> None:
        """``sock`` drained to half its cap or closed: once no socket holds the connection, refill the
        ring."""
        if sock not in self.rx_holds:
            return
        self.rx_holds.discard(sock)
        if not self.rx_holds:
            self.counters["ib_recv_hold_released"] += 1
            self._pump()

    def _post_rdma(self, wr: SendWR) -> None:
        """``rds_ib_xmit_rdma``: the op's local bytes in a registered bounce buffer (the client's memory is
        another process's), one RDMA WR; the buffer is released when the WR completes."""
        assert self.qp is not None
        op = wr.rdma
        bounce = self.qp.reg_mr(op.nbytes, remote=False)
        posted = _PostedRdma(op, bounce, _opcode_of(op), alone=wr.alone)
        try:
            if op.atomic and op.masked:  # emulated with plain atomics: stack.rdma.MaskedAtomic
                posted.chain = MaskedAtomic(op)
                self.counters["ib_atomic_masked"] += 1
                self._post_atomic(wr.wr_id, posted, posted.chain.first(), op.fence)
            elif op.atomic:  # rds_ib_xmit_atomic, as one plain atomic
                step = AtomicStep(op.atomic == ATOMIC_FADD, op.compare_add, op.swap)
                self._post_atomic(wr.wr_id, posted, step, op.fence)
            else:
                if op.write:
                    bounce.write(0, op.data)
                self.qp.post_rdma(wr.wr_id, op.write, bounce, op.nbytes, op.rkey, op.remote_addr, op.fence)
        except BaseException:
            bounce.close()
            raise
        self._rdma_wrs[wr.wr_id] = posted
        self.counters["ib_tx_rdma"] += 1

    def _post_atomic(self, wr_id: int, posted: _PostedRdma, step: AtomicStep, fence: bool) -> None:
        """One plain atomic WR on the op's word (the original value lands in the bounce buffer)."""
        assert self.qp is not None
        op = posted.op
        self.qp.post_atomic(
            wr_id, step.fetch_add, posted.bounce, op.rkey, op.remote_addr, step.compare_add, step.swap, fence
        )
        posted.opcode = WcOpcode.FETCH_ADD if step.fetch_add else WcOpcode.COMP_SWAP
        self.counters["ib_tx_atomic"] += 1

    def _post_step(self, wr_id: int, posted: _PostedRdma, step: AtomicStep) -> None:
        """The next compare-and-swap of a masked atomic's chain, under the same wr_id (nothing else of the
        ring is posted meanwhile: the engine holds the op's message until :meth:`IbEngine.send_complete`)."""
        assert posted.chain is not None
        if posted.chain.swaps > 1:
            self.counters["ib_atomic_masked_retry"] += 1  # the previous swap lost a race on the word
        self._post_atomic(wr_id, posted, step, False)
        self._rdma_wrs[wr_id] = posted

    def _count_atomic(self, op: Any) -> None:
        """``rds_ib_send_unmap_atomic``: an atomic's completion (success or error) counts its type."""
        if op.atomic:
            self.counters["ib_atomic_cswp" if op.atomic == ATOMIC_CSWP else "ib_atomic_fadd"] += 1

    # -- teardown -------------------------------------------------------------------------------------------
    def _fail(self, what: str, exc: VerbsError) -> None:
        self.counters["ib_verbs_error"] += 1
        self.close(f"{what}: {exc}")

    def close(self, reason: str = "closed") -> None:
        """Tear down (idempotent): the engine goes DOWN, the QP to ERR and away, the id disconnects and is
        destroyed, and the owner hears :meth:`ConnOwner.conn_closed`."""
        if self.state == ConnState.CLOSED:
            return
        was = self.state
        self.state = ConnState.CLOSED
        self.close_reason = reason
        if self.engine.state != PathState.DOWN:
            self.engine.connection_lost(self.clock())
        for posted in self._rdma_wrs.values():  # flushed: no notification (rds_ib_send_complete)
            _close_quietly(posted.bounce)
        self._rdma_wrs.clear()
        self._deferred.clear()
        if self._qp_fd >= 0:
            self.loop.remove_reader(self._qp_fd)
            self._qp_fd = -1
        if self.qp is not None:
            try:
                self.qp.to_error()
            except VerbsError as exc:
                log.debug("%r: QP to ERR failed: %s", self, exc)
            _close_quietly(self.qp)
            self.qp = None
        if self.cmid is not None:
            if was in (ConnState.UP, ConnState.ACCEPTING):
                try:
                    self.cmid.disconnect()
                except VerbsError as exc:
                    log.debug("%r: disconnect failed: %s", self, exc)
            _close_quietly(self.cmid)
            self.cmid = None
        if self._ch_fd >= 0:
            self.loop.remove_reader(self._ch_fd)
            self._ch_fd = -1
        if self.channel is not None:
            _close_quietly(self.channel)
            self.channel = None
        log.debug("%r closed: %s", self, reason)
        self.owner.conn_closed(self, reason)

    def _report(self, events: list[IbEvent]) -> None:
        if events:
            self.owner.conn_events(self, events)


def _chain_outcome(chain: MaskedAtomic) -> tuple[int, bytes]:
    """(RDMA status, the bytes for the client's local word) of a finished masked atomic: the original value
    in host byte order, as an HCA writes an atomic's result; nothing when it gave up."""
    if chain.result is None:
        return chain.status, b""
    return chain.status, chain.result.to_bytes(8, sys.byteorder)


def _gid(raw: bytes) -> bytes:
    """A GID as the verbs layer gave it, if it is one (16 bytes), else zeros."""
    return bytes(raw) if isinstance(raw, bytes | bytearray) and len(raw) == 16 else bytes(16)


class _Closable(Protocol):
    def close(self) -> None: ...


def _close_quietly(obj: _Closable) -> None:
    try:
        obj.close()
    except VerbsError as exc:
        log.debug("close of %r failed: %s", obj, exc)


def reject_request(request: CmId, private_data: bytes) -> None:
    """Answer a CONNECT_REQUEST with a REJ carrying ``private_data`` and destroy its id (failures are only
    logged: the peer sees a timeout instead)."""
    try:
        request.reject(private_data)
    except VerbsError as exc:
        log.debug("reject failed: %s", exc)
    _close_quietly(request)


class IbListener:
    """The passive side's rdma_cm listener on ``addr``:``port``. CONNECT_REQUESTs go to ``on_request``, which
    returns the connection it made (or None); every other event on the listener's channel belongs to an
    accepted id and goes to the current passive connection.

    pyverbs 44 does not say which id an event is for, and accepted ids report on the listener's channel, so
    only one passive connection can be in progress or UP at a time; ``on_request`` must reject others (the
    owner's business; :attr:`passive` is the one it may keep).
    """

    def __init__(
        self,
        verbs: Verbs,
        loop: FdLoop,
        addr: str,
        on_request: Callable[[CmEvent], IbConnection | None],
        *,
        port: int = RDS_IB_PORT,
        backlog: int = 128,
    ) -> None:
        self.verbs = verbs
        self.loop = loop
        self.addr = addr
        self.port = port
        self.backlog = backlog
        self.on_request = on_request
        self.passive: IbConnection | None = None
        self.counters: Counter[str] = Counter()
        self.channel: CmChannel | None = None
        self.cmid: CmId | None = None
        self._fd = -1

    def start(self) -> None:
        """Listen; :class:`VerbsError` if that is impossible (nothing is left open then)."""
        channel = self.verbs.create_channel()
        try:
            cmid = channel.create_id()
            try:
                cmid.listen(self.addr, self.port, self.backlog)
            except VerbsError:
                _close_quietly(cmid)
                raise
        except VerbsError:
            _close_quietly(channel)
            raise
        self.channel = channel
        self.cmid = cmid
        self._fd = channel.fileno()
        self.loop.add_reader(self._fd, self._on_channel)

    @property
    def busy(self) -> bool:
        return self.passive is not None and self.passive.state != ConnState.CLOSED

    def _on_channel(self) -> None:
        while self.channel is not None:
            try:
                ev = self.channel.get_event()
            except VerbsError as exc:
                self.counters["ib_listener_error"] += 1
                log.warning("listener %s:%d: %s", self.addr, self.port, exc)
                return
            if ev is None:
                return
            if ev.kind == CmEventKind.CONNECT_REQUEST:
                self.counters["ib_listener_requests"] += 1
                if ev.request is None:
                    self.counters["ib_listener_error"] += 1
                    continue
                conn = self.on_request(ev)
                if conn is not None and conn.state != ConnState.CLOSED:
                    self.passive = conn
            elif self.busy:
                assert self.passive is not None
                self.passive.handle_cm(ev)
            else:
                self.counters["ib_listener_stray_event"] += 1
                log.debug("listener %s:%d: event %s for no connection", self.addr, self.port, ev.kind.name)

    def close(self) -> None:
        if self._fd >= 0:
            self.loop.remove_reader(self._fd)
            self._fd = -1
        if self.cmid is not None:
            _close_quietly(self.cmid)
            self.cmid = None
        if self.channel is not None:
            _close_quietly(self.channel)
            self.channel = None
