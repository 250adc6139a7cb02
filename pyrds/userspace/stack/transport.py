"""What a transport is to the stack, and what the stack is to a transport (``struct rds_transport``).

The stack core (sockets, ports, queues, congestion) never does I/O toward a peer. It hands each accepted
message to a :class:`Transport` and is told back, through the narrow :class:`StackHost` interface, when a
message arrived (``deliver``), when a sent one was acked (``acked``) and when a peer's congestion map changed.
A transport never reaches into the stack beyond :class:`StackHost`, and the stack never names a transport's
classes: it only knows this interface.

Transports that need the daemon's event loop (sockets, timers) get an :class:`EventLoop`.

Adding a transport (RDS/IB, say) means a package under ``pyrds/userspace/transports/`` implementing
:class:`Transport`, and one line in the service that attaches it to the stack.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from pyrds.addr import IPAddress
from pyrds.constants import Transport as TransportType
from pyrds.userspace.config import StackConfig
from pyrds.userspace.proto.cong import CongestionMap
from pyrds.userspace.stack.sockstate import Incoming, Outgoing

__all__ = [
    "ConnectionRow",
    "EventLoop",
    "HashKey",
    "MessageRow",
    "RdmaConnectionRow",
    "RdmaTransport",
    "StackHost",
    "TcpSocketRow",
    "Transport",
    "select_transport",
]

#: what picks a message's path: (the sending socket's bound port, its ``rs_hash_initval``)
HashKey = tuple[int, int]
#: a callback of the event loop: called with the ready mask (``selectors.EVENT_READ`` / ``EVENT_WRITE``)
IoCallback = Callable[[int], None]


class ConnectionRow(NamedTuple):
    """One connection for RDS_INFO_CONNECTIONS / RDS6_INFO_CONNECTIONS."""

    next_tx_seq: int
    next_rx_seq: int
    laddr: IPAddress
    faddr: IPAddress
    transport: str  # the name the kernel shows ("loopback", "tcp")
    flags: int  # InfoConnectionFlag bits
    tos: int


class MessageRow(NamedTuple):
    """One message for RDS_INFO_SEND_MESSAGES / RDS_INFO_RETRANS_MESSAGES (and the RDS6 tables)."""

    seq: int
    length: int
    laddr: IPAddress
    faddr: IPAddress
    lport: int
    fport: int
    tos: int


class TcpSocketRow(NamedTuple):
    """One TCP socket for RDS_INFO_TCP_SOCKETS / RDS6_INFO_TCP_SOCKETS."""

    laddr: IPAddress
    lport: int
    faddr: IPAddress
    fport: int
    hdr_rem: int
    data_rem: int
    last_sent_nxt: int
    last_expected_una: int
    last_seen_una: int


class RdmaConnectionRow(NamedTuple):
    """One connection for RDS_INFO_IB_CONNECTIONS / RDS6_INFO_IB_CONNECTIONS (``rds_info_rdma_connection``)"""

    laddr: IPAddress
    faddr: IPAddress
    src_gid: bytes  # 16 bytes; zero unless the connection is up
    dst_gid: bytes
    max_send_wr: int
    max_recv_wr: int
    max_send_sge: int
    rdma_mr_max: int
    rdma_mr_size: int
    tos: int
    sl: int
    cache_allocs: int


@runtime_checkable
class RdmaTransport(Protocol):
    """What an RDMA transport (RDS/IB) adds to :class:`Transport` for the info tables: its connections for
    RDS_INFO_IB_CONNECTIONS and its statistics for RDS_INFO_COUNTERS. The stack answers those tables only
    while such a transport is attached, as a kernel only with rds_rdma loaded."""

    def info_rdma_connections(self) -> Iterable[RdmaConnectionRow]: ...

    def stat_counters(self) -> Mapping[str, int]:
        """Everything the transport counted: ``rds_ib_stat_names`` names, core names it counts itself (added
        to the stack's), and userspace-only ones."""
        ...


class EventLoop(Protocol):
    """The daemon's event loop as a transport uses it (the service implements it)."""

    def register(self, sock: socket.socket, events: int, cb: IoCallback) -> None: ...
    def modify(self, sock: socket.socket, events: int, cb: IoCallback) -> None: ...
    def unregister(self, sock: socket.socket) -> None: ...
    def call_later(self, delay: float, cb: Callable[[], None]) -> None: ...


class StackHost(Protocol):
    """The upcalls a transport may make into the stack (the kernel's ``/* recv.c */ rds_recv_incoming``,
    ``/* send.c */ rds_send_drop_acked``, ``/* cong.c */ rds_cong_map_updated`` ...), and nothing else."""

    @property
    def config(self) -> StackConfig:
        """Sysctls, ports and buffer defaults of this stack."""
        ...

    @property
    def counters(self) -> dict[str, int]:
        """The stack's statistics (RDS_INFO_COUNTERS names and the userspace extras), updated in place."""
        ...

    def deliver(self, inc: Incoming) -> bool:
        """A message arrived (after the transport's sequence checks): queue it for its socket. False: that
        socket's queue is over its cap; a transport that reads a peer stops (:meth:`hold_reader`)."""

    def hold_reader(self, daddr: IPAddress, dport: int, key: int, resume: Callable[[], None]) -> bool:
        """Register ``resume`` (once, per ``key``) for when the socket at (daddr, dport) is back under half
        its receive cap or closed; False (nothing registered) if it is not over its cap."""

    def push_acked(self, daddr: IPAddress, dport: int) -> None:
        """Messages delivered to the socket at (daddr, dport) with a ``read_ack`` that is now set may go to
        its reader: push them (in order, behind any that still may not)."""

    def acked(self, msg: Outgoing) -> None:
        """A sent message will never be sent again: release its send-buffer bytes."""

    def acks_awaited(self, msg: Outgoing) -> bool:
        """Whether a sender waits for ``msg``'s ack now (its send buffer is half full or more, or a zerocopy
        completion is due): a transport that polls for acks then polls soon, else it may learn them later."""
        ...

    def is_local(self, ip: IPAddress, scope_id: int = 0) -> bool:
        """Whether ``ip`` is an address of this node (namespace)."""
        ...

    def local_cong_map(self, laddr: IPAddress) -> CongestionMap:
        """The congestion map of local address ``laddr``, shared by every connection from it (send it)."""
        ...

    def peer_cong_map(self, faddr: IPAddress, cmap: CongestionMap) -> None:
        """A peer's congestion map arrived: it replaces our copy and wakes the sockets waiting on it."""

    def cong_updated(self, portmask: int) -> None:
        """``rds_cong_map_updated``: a map changed for the ports in ``portmask`` (without replacing one)."""

    def rdma_complete(self, op: Any, status: int, data: bytes = b"") -> None:
        """An RDMA op's work request completed (``rds_rdma_send_complete``): RDS_RDMA_* ``status``; ``data``:
        a successful READ's bytes."""

    def rdma_sync_mrs(self, laddr: IPAddress) -> None:
        """A peer's message to ``laddr`` came after a gap in its sequence numbers (messages it never sent: a
        silent RDMA op's, whose WRITE landed before this message, unannounced): the MRs of the sockets bound
        to ``laddr`` show their clients what the peer wrote, before the message is delivered."""


class Transport(Protocol):
    """One way of reaching peers (``struct rds_transport``).

    Connections are the transport's business: it connects (or accepts) on demand when :meth:`transmit` needs a
    peer, reconnects and retransmits as its protocol says, and reports through :class:`StackHost`.
    """

    #: ``SO_RDS_TRANSPORT`` value (``t_type``)
    kind: TransportType
    #: ``t_prefer_loopback``: destinations local to the node go to the loop transport instead
    prefer_loopback: bool
    #: transmit completes inside the call (no I/O: delivered and acked at once); otherwise the send path may
    #: hand the message over after it replied to the sender (:class:`pyrds.userspace.stack.outbox.Outbox`)
    immediate: bool

    def start(self) -> None:
        """Begin accepting connections from peers (a listener); OSError when that is impossible."""

    def laddr_check(self, ip: IPAddress) -> bool:
        """``t->laddr_check``: a socket pinned to this transport may bind ``ip`` (else bind fails with
        ENOPROTOOPT)."""
        ...

    def transmit(self, msg: Outgoing, hash_key: HashKey) -> None:
        """Queue ``msg`` toward ``msg.daddr``; ``hash_key`` picks the path of a multipath connection."""

    def cork(self) -> None:
        """Until :meth:`uncork`, messages given to :meth:`transmit` are queued but not written yet (several
        frames then go out in one write). Never nested."""

    def uncork(self) -> None:
        """Write what :meth:`transmit` queued since :meth:`cork`."""

    def cancel(self, msgs: Sequence[Outgoing]) -> None:
        """The sender no longer waits for ``msgs`` (RDS_CANCEL_SENT_TO, close: ``rds_send_drop_to``): drop
        each one that is not on the wire yet, stop accounting the others; messages this transport never
        took are ignored. All of a close's or a cancel's messages come in one call, and the work must grow
        with their number and the transport's queues, not with their product (a socket may hold ~100k)."""

    def cong_map_changed(self, laddr: IPAddress) -> None:
        """The local map of ``laddr`` changed: tell every peer connected from ``laddr``."""

    def reset(self) -> None:
        """Drop every connection (``rds_tcp_skbuf_handler``); what the peers sent before is still read."""

    def busy(self) -> bool:
        """Connections are open or messages queued. The service's idle rule (``Server._peers_connected``)
        keeps the stack only while this holds *and* a TCP socket has a peer; pending dials and the queued
        messages of closed sockets alone do not keep it."""
        ...

    def close(self) -> None:
        """Stop: close the listener and every connection."""

    def info_connections(self) -> Iterable[ConnectionRow]: ...
    def info_messages(self, retransmit_only: bool) -> Iterable[MessageRow]: ...
    def info_tcp_sockets(self) -> Iterable[TcpSocketRow]: ...


def select_transport(
    transports: Iterable[Transport], local_dest: bool, pinned: TransportType | None = None
) -> Transport | None:
    """``rds_trans_get_preferred`` + ``t_prefer_loopback``: the transport for a destination, None for none.

    A destination local to the node goes to the loop transport when the network transport prefers loopback (or
    there is none); any other destination goes to the first network transport. The network transport of a
    socket of IB (pinned with SO_RDS_TRANSPORT, or bound to an RDMA device's address: ``Stack.bind``) is the
    IB one; every other socket's is the first that is not IB."""
    loop: Transport | None = None
    network: Transport | None = None
    want_ib = pinned == TransportType.IB
    for t in transports:
        if t.kind == TransportType.LOOP:
            loop = loop or t
        elif (t.kind == TransportType.IB) == want_ib:
            network = network or t
    if local_dest and (network is None or network.prefer_loopback):
        return loop
    return network
