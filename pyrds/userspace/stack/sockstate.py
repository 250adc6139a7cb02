"""Per-socket state of the userspace stack: addresses, options, queues and buffer accounting."""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyrds.addr import IPAddress
from pyrds.constants import RDS_MAX_ZCOOKIES, Transport
from pyrds.userspace.proto.cong import uncongest_budget
from pyrds.userspace.stack.resources import recv_cap

_inum = itertools.count(1000)


class ReadinessSink(Protocol):
    """Where a socket's poll state goes: the service's readiness fd (the client polls it)."""

    #: the states last set (what the fd shows, as far as this side knows)
    readable: bool
    writable: bool
    #: a byte that makes the fd readable was sent and its arrival not seen yet (:meth:`delivered`)
    unconfirmed: bool

    def set_readable(self, flag: bool) -> None: ...
    # before a push: make sure the byte last sent has arrived (``client_taken``: what the client's report page
    # says it took from the fd)
    def delivered(self, client_taken: int | None = None) -> None: ...
    def set_writable(self, flag: bool) -> None: ...
    def client_drained(self, readable: bool, client_taken: int | None = None) -> None: ...
    def close(self) -> None: ...


class PushSink(Protocol):
    """Where received messages go without a request: the client's data channel (service/datachannel.py)."""

    #: the largest payload one push carries; larger messages are served by request
    max_payload: int

    def push(
        self, saddr: bytes, sport: int, scope_id: int, payload: bytes, tail: bool, byte_follows: bool = False
    ) -> bool:
        """``tail``: nothing else is readable; ``byte_follows``: the readiness fd is empty and is made
        readable for this message right after the push."""

    def unblock(self, consumed: int, in_channel: int) -> None: ...
    def set_sync(self, flag: bool, sync_at: int = 0) -> None: ...
    def publish_counts(self, queued: int, served: int) -> None: ...
    def publish_send(self, released: int, released_empty: int, sndbuf: int, epoch: int) -> None: ...
    def reported(self) -> tuple[int, int]: ...
    def close(self) -> None: ...


class WakerSink(Protocol):
    """How a blocking sender that waits for a congested port is woken: the service's send waker
    (service/sendwaker.py)."""

    def wake(self) -> None: ...
    def close(self) -> None: ...


class ReadAck:
    """Whether the ACK for one RDS/TCP read is known to be out (tcp/path.py ``_acked_read``): shared by the
    messages of a read that was not known acked when it was fed, set once TCP is seen to have sent a segment
    after it or a later read of the same connection is acked (TCP's ACK is cumulative), so they may then be
    pushed. ``segs_out``: the connection's tcpi_segs_out just after the read (None: unknown)."""

    __slots__ = ("acked", "segs_out")

    def __init__(self, segs_out: int | None = None) -> None:
        self.acked = False
        self.segs_out = segs_out


class CongGeneration:
    """``rds_cong_generation``: bumped by every congestion-map update (rds_cong_map_updated) of the stack."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


@dataclass(slots=True)
class Incoming:
    """A received message queued on a socket (``struct rds_incoming``)."""

    saddr: IPAddress
    daddr: IPAddress
    sport: int
    dport: int
    payload: bytes
    seq: int = 0
    tos: int = 0
    rx_tstamp_ns: int = 0
    #: local_clock() (ns) at the trace points HDR_TO_DGRAM_START, DGRAM_REASSEMBLE, DGRAM_DELIVERED, END
    lat: tuple[int, int, int, int] = (0, 0, 0, 0)
    #: may go to the reader's data channel (False: served by request, unless ``read_ack`` says its read is
    #: acked by now; RDS/TCP, see tcp/path.py ``_acked_read``)
    pushable: bool = True
    #: RDS/TCP: the read this message came in, when it was not known acked then (None: ``pushable`` decides)
    read_ack: ReadAck | None = None
    #: RDS_EXTHDR_RDMA: the r_key of the receiver's MR an RDMA op of this message used (``rds_rdma_unuse``)
    rdma_key: int | None = None
    #: RDS_EXTHDR_RDMA_DEST as a cookie (r_key | offset << 32): recvmsg gives it as RDS_CMSG_RDMA_DEST
    rdma_cookie: int = 0


@dataclass(slots=True)
class Outgoing:
    """A message a socket queued (``struct rds_message``) until it is acked."""

    sock_id: int
    saddr: IPAddress
    daddr: IPAddress
    sport: int
    dport: int
    payload: bytes
    tos: int = 0
    seq: int = 0
    zcookie: int | None = None
    #: ``rm->rdma``: the RDMA READ/WRITE that goes out before this message (stack/rdma.py ``RdmaOp``)
    rdma: Any = None
    #: ``m_rdma_cookie``: sent to the peer as RDS_EXTHDR_RDMA_DEST
    rdma_cookie: int = 0


@dataclass
class SockState:
    """``struct rds_sock``."""

    sock_id: int
    sndbuf: int
    rcvbuf: int
    inum: int = field(default_factory=lambda: next(_inum))
    hash_initval: int = field(default_factory=lambda: random.getrandbits(32))  # rs_hash_initval
    bound_addr: IPAddress | None = None
    bound_port: int = 0
    scope_id: int = 0
    conn_addr: IPAddress | None = None
    conn_port: int = 0
    transport: Transport | None = None
    tos: int = 0
    recv_queue: deque[Incoming] = field(default_factory=deque)
    rcv_bytes: int = 0
    #: bytes charged against the receive cap: payload + RECV_MSG_OVERHEAD per queued message
    rcv_charge: int = 0
    #: transports that stopped reading a connection because this queue is over its cap: key -> resume
    rcv_waiters: dict[int, Callable[[], None]] = field(default_factory=dict)
    #: messages the client read from its data channel (CONSUMED), each counted as payload +
    #: RECV_MSG_OVERHEAD: the client counts them the same way (the page's sync point, :meth:`sync_reads`)
    consumed_charge: int = 0
    congested: bool = False
    snd_bytes: int = 0
    sent: dict[int, Outgoing] = field(default_factory=dict)  # id(Outgoing) -> message, until acked
    #: how many of ``sent`` are empty (no payload bytes): capped at ``rds_sndbuf`` (:meth:`send_full`)
    snd_empty: int = 0
    cong_monitor: bool = False
    cong_mask: int = 0
    cong_notify: int = 0
    #: rs_cong_track: the generation this socket last looked at (see :meth:`hist_pollin`)
    cong_track: int = 0
    cong_gen: CongGeneration | None = None
    #: rs_seen_congestion: a send failed on a congested port since the historical POLLIN was last seen
    seen_congestion: bool = False
    recverr: bool = False
    timestamp: bool = False
    zerocopy: bool = False
    zcookies: deque[list[int]] = field(default_factory=deque)
    rx_traces: tuple[int, ...] = ()
    readiness: ReadinessSink | None = None
    #: the client's data channel (None: every message is served by request)
    push: PushSink | None = None
    #: wakes the client's blocking send that waits for a congested port (None: the client polls)
    send_waker: WakerSink | None = None
    #: how many messages at the head of ``recv_queue`` were pushed and not yet reported consumed
    pushed: int = 0
    #: the client's report page as last taken (rpc.REPORT_PAGE): messages it read from the channel, bytes it
    #: took from the readiness fd; ``pull`` takes what it says since (set by the stack; None: no page)
    reads_seen: int = 0
    taken_seen: int = 0
    pull: Callable[[], None] | None = None
    #: messages the receive queue ever took, and those of them that left it by request (published to the
    #: client on its page: it then knows what the queue holds before its notices are taken)
    queued_total: int = 0
    served_total: int = 0
    #: bytes that ever left ``snd_bytes`` (acked, cancelled): with what the client sent, its send buffer;
    #: and the empty messages that ever left ``sent``: with those the client sent, its empty ones in flight
    snd_released: int = 0
    snd_empty_released: int = 0
    #: posted sends (service/posting.py): the socket's post epoch (moved to void a grant); the last grant:
    #: its epoch (-1: none; live while it equals ``post_epoch``), destination and send buffer. Kept once
    #: void: posts the client made before it saw the new epoch come after, and are taken under it
    post_epoch: int = 0
    grant_epoch: int = -1
    grant_dest: tuple[IPAddress, int] | None = None
    grant_sndbuf: int = 0
    dead: bool = False
    sent_any: bool = False  # rs_conn set (a message was sent)
    #: the client's memory for RDMA (stack/memory.py; None: this process's own, an in-process caller)
    memory: Any = None
    #: rs_rdma_keys: the socket's MRs by r_key (stack/rdma.py ``MemRegion``)
    mrs: dict[int, Any] = field(default_factory=dict)
    #: rs_notify_queue: (user_token, status) of RDMA ops that asked for RDS_RDMA_NOTIFY_ME
    rdma_notify: deque[tuple[int, int]] = field(default_factory=deque)

    @property
    def rds_sndbuf(self) -> int:
        return self.sndbuf // 2

    @property
    def rds_rcvbuf(self) -> int:
        return self.rcvbuf // 2

    def send_full(self) -> bool:
        """The send buffer has no room: ``rs_snd_bytes >= rds_sk_sndbuf(rs)`` (``rds_send_queue_rm``), or,
        beyond the kernel, ``rds_sndbuf`` empty messages in flight (they add no bytes, so the kernel queues
        them without limit; each holds memory here)."""
        return self.snd_bytes >= self.rds_sndbuf or self.snd_empty >= self.rds_sndbuf

    def add_zcookie(self, cookie: int) -> None:
        """rds_zcookie_add: append to the last completion entry while it has room."""
        if self.zcookies and len(self.zcookies[-1]) < RDS_MAX_ZCOOKIES:
            self.zcookies[-1].append(cookie)
        else:
            self.zcookies.append([cookie])

    def has_input(self) -> bool:
        return bool(self.recv_queue or self.cong_notify or self.zcookies or self.rdma_notify)

    def cong_updated_since(self) -> bool:
        """rds_cong_updated_since without consuming: a map update happened since ``cong_track``."""
        return self.cong_gen is not None and self.cong_track != self.cong_gen.value

    def hist_pollin(self) -> bool:
        """rds_poll's "historical" POLLIN: no RDS_CONG_MONITOR and a map update since the socket last looked.

        Only sockets that saw congestion show it on the fd (those are the pollers the kernel wakes through
        rds_poll_waitq); it is consumed by the socket's next send/recv (:meth:`CongestionTable.look`)."""
        return not self.cong_monitor and self.seen_congestion and self.cong_updated_since()

    def may_push(self) -> bool:
        """Received messages may go to the data channel: nothing a recvmsg would add to them or serve before
        them (timestamps, rx path latency, zerocopy completions, congestion notifications)."""
        return (
            self.push is not None
            and not self.dead
            and not (self.timestamp or self.rx_traces or self.zerocopy or self.cong_monitor)
            and not (self.cong_notify or self.zcookies or self.rdma_notify)
        )

    def sync_reads(self) -> None:
        """Tell the client whether its reads change what others see at once (congested port, a transport
        waiting for this queue to drain): then it reports synchronously, before its recv returns, each read
        from the one that can end that state (``sync_at``, in the units of :attr:`consumed_charge`: a
        message counts its length plus RECV_MSG_OVERHEAD, at least what it takes off the queue's byte count
        and exactly what it takes off its charge; arrivals only move the true point later)."""
        if self.push is None:
            return
        budgets = []
        if self.congested:
            budgets.append(uncongest_budget(self.rcv_bytes, self.rcvbuf))
        if self.rcv_waiters:
            budgets.append(max(0, self.rcv_charge - recv_cap(self.rcvbuf) // 2))
        if budgets:
            self.push.set_sync(True, self.consumed_charge + min(budgets))
        else:
            self.push.set_sync(False)

    def publish_counts(self) -> None:
        """The receive queue's totals on the client's page (service/datachannel.py)."""
        if self.push is not None:
            self.push.publish_counts(self.queued_total, self.served_total)

    def publish_send(self) -> None:
        """What a posting client checks on its page: released bytes and empty messages, the grant's buffer,
        the epoch."""
        if self.push is not None:
            self.push.publish_send(
                self.snd_released, self.snd_empty_released, self.grant_sndbuf, self.post_epoch
            )

    def resync_readiness(self, client_taken: int | None = None) -> None:
        """The client emptied the readiness fd after reading the tail of the queue (``client_taken``: the
        bytes it ever took from it, if it said): make it true again."""
        r = self.readiness
        if r is not None:
            r.client_drained(self.has_input() or self.hist_pollin(), client_taken)

    def update_readiness(self) -> None:
        r = self.readiness
        if r is None:
            return
        if (
            r.readable
            and self.pull is not None
            and (self.cong_notify or self.zcookies or self.rdma_notify or self.seen_congestion)
        ):
            # the client may have emptied the fd since (its reads are on its report page): take them first,
            # or this new reason to be readable would find the fd "already" readable (a new message is
            # delivered after a look, Stack.deliver)
            self.pull()
        # called several times per message: the fd is only touched when a state changes. The tests are
        # inline (no method calls): has_input() or hist_pollin(), then not send_full()
        readable = bool(self.recv_queue or self.cong_notify or self.zcookies or self.rdma_notify) or (
            not self.cong_monitor and self.seen_congestion and self.cong_updated_since()
        )
        if readable != r.readable:
            r.set_readable(readable)
        limit = self.sndbuf // 2  # rds_sndbuf; rds_poll: POLLOUT while rs_snd_bytes < rds_sk_sndbuf(rs)
        writable = self.snd_bytes < limit and self.snd_empty < limit
        if writable != r.writable:
            r.set_writable(writable)
