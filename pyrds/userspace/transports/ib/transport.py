"""The RDS/IB transport of the userspace stack (``rds_ib_transport``): one :class:`~.node.IbNode` per local
IPv4 or IPv6 address that has an RDMA device, behind the :class:`~pyrds.userspace.stack.transport.Transport`
interface. Sockets pinned with ``SO_RDS_TRANSPORT=IB`` use it, and so do unpinned sockets bound to an
RDMA device's address (``Stack.bind``, as rds_trans_get_preferred tries IB before TCP).

A node is made the first time an address passes :meth:`IbTransport.laddr_check` (``rds_ib_laddr_check``: a
socket binds it). It listens on rdma_cm port 18634 (IPv4) or 16385 (IPv6) when it can; when the port is
taken (the kernel's rds_rdma listens on both in the initial namespace) the node runs active-only and the log
says so. The nodes' engine events become :class:`~pyrds.userspace.stack.transport.StackHost` calls as the
TCP transport makes them: messages are delivered, the peer's acks release the sent messages, a peer's
congestion map replaces ours.

A receiving socket over its receive cap (``Stack.deliver`` says so; counted in ``ib_recv_over_cap``) holds
the connection the message came on: its receive ring is not refilled until the socket drained to half its
cap or closed, so the peer's sends stall in RC's RNR retries instead of queueing in the service
(:meth:`~.driver.IbConnection.hold_receive`; the RDS/TCP path stops reading its socket the same way).

Not done (yet): IPv6 link-local addresses (the kernel binds them with the socket's scope id; here the address
check refuses them, so such a bind gets the errno of an address without an RDMA device); one connection per
peer, TOS 0.

RDS_CANCEL_SENT_TO (and close) take a socket's unacked messages off their connection as
``rds_send_drop_to`` does (:meth:`IbTransport.cancel`, all of them in one pass over each connection): one
still queued is never sent, one sent and unacked is not retransmitted after a reconnect, and its RDMA op is
not posted; fragments already posted complete.
"""

from __future__ import annotations

import errno
import logging
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from pyrds.addr import IPAddress
from pyrds.constants import ExtHeaderType, InfoConnectionFlag
from pyrds.constants import Transport as TransportType
from pyrds.userspace.proto import (
    CongMapDropped,
    CongMapReceived,
    DuplicateDropped,
    ExtHeader,
    MessageReceived,
    NpathsNegotiated,
    PathState,
    PeerGenChanged,
    PingReceived,
    PongReceived,
    SendQueueFull,
)
from pyrds.userspace.stack.counters import count_receive_event
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.ports import is_loopback, normalize
from pyrds.userspace.stack.sockstate import Incoming, Outgoing
from pyrds.userspace.stack.transport import (
    ConnectionRow,
    HashKey,
    MessageRow,
    RdmaConnectionRow,
    StackHost,
    TcpSocketRow,
)
from pyrds.userspace.transports.ib.driver import ConnState, FdLoop
from pyrds.userspace.transports.ib.events import IbEvent, MessagesAcked, RdmaCompleted, SequenceGap
from pyrds.userspace.transports.ib.node import IbNode
from pyrds.userspace.transports.ib.verbs import MemoryRegion, Verbs, VerbsError
from pyrds.userspace.transports.ib.wire import RDS_CM_PORT, RDS_IB_PORT

__all__ = ["IbTransport"]

log = logging.getLogger("pyrds.userspace.ib")

#: a failed address check is asked again after this long (addresses come and go)
NEGATIVE_CHECK_TTL = 1.0
#: peers per local address (each connection holds two rings of 4 KiB buffers)
MAX_PEERS = 256
#: local addresses with a node
MAX_NODES = 64
#: ``RDS_IB_MAX_SGE``: the kernel shows ``min(device max_sge, 8)`` as max_send_sge
RDS_IB_MAX_SGE = 8
_NO_GID = bytes(16)

Key = tuple[IPAddress, IPAddress]


def _rdma_exthdrs(inc: Incoming, exthdrs: Iterable[ExtHeader]) -> None:
    """``rds_recv_incoming_exthdrs``: RDS_EXTHDR_RDMA (the receiver's MR an op used) and
    RDS_EXTHDR_RDMA_DEST (a cookie for the receiver's recvmsg)."""
    for ext in exthdrs:
        if ext.type == ExtHeaderType.RDMA:
            inc.rdma_key = struct.unpack(">I", ext.body)[0]
        elif ext.type == ExtHeaderType.RDMA_DEST:
            key, offset = struct.unpack(">II", ext.body)
            inc.rdma_cookie = key | offset << 32  # rds_rdma_make_cookie


def _pair(saddr: IPAddress, daddr: IPAddress) -> Key | None:
    """(local, peer) as the nodes key them (v4-mapped IPv6 as IPv4), or None when the families differ."""
    la, fa = normalize(saddr), normalize(daddr)
    return (la, fa) if la.version == fa.version else None


class IbTransport:
    kind = TransportType.IB
    prefer_loopback = False  # rds_ib_transport sets no t_prefer_loopback: a local peer is reached over IB
    immediate = False

    def __init__(
        self,
        host: StackHost,
        loop: FdLoop,
        verbs: Verbs,
        *,
        listen: bool = True,
        port: int = RDS_IB_PORT,
        port6: int = RDS_CM_PORT,
        clock: Callable[[], float] = time.monotonic,
        engine_kwargs: dict[str, int] | None = None,
    ) -> None:
        self.host = host
        self.loop = loop
        self.verbs = verbs
        self.listen = listen
        #: rdma_cm ports of IPv4 and IPv6 nodes (18634 and 16385, as the kernel's :func:`~.node.cm_port`)
        self.port = port
        self.port6 = port6
        self.clock = clock
        self.engine_kwargs = dict(engine_kwargs or {})
        self.nodes: dict[IPAddress, IbNode] = {}
        #: messages of sockets on the wire or queued, by connection and sequence, until acked
        self.pending: dict[Key, dict[int, Outgoing]] = {}
        self.closed = False
        self._refused: dict[IPAddress, float] = {}
        self._corked: dict[Key, None] | None = None

    # -- addresses and nodes
    def start(self) -> None:
        """Nothing to listen on yet: each address gets its node (and listener) when it is first checked."""

    def laddr_check(self, ip: IPAddress) -> bool:
        """``rds_ib_laddr_check``: ``ip`` is an address of an RDMA device of this node (then it has a node
        from now on). IPv6 link-local addresses are refused (see the module docstring)."""
        addr = normalize(ip)
        if addr.is_unspecified or is_loopback(addr) or self.closed:
            return False
        if addr.version == 6 and (addr.is_link_local or addr.is_multicast):
            return False
        if addr in self.nodes:
            return True
        now = time.monotonic()
        until = self._refused.get(addr)
        if until is not None and until > now:
            return False
        dev = self.verbs.addr_device(str(addr))
        if dev is None or len(self.nodes) >= MAX_NODES:
            if len(self._refused) >= 4 * MAX_NODES:
                self._refused.clear()
            self._refused[addr] = now + NEGATIVE_CHECK_TTL
            return False
        self._refused.pop(addr, None)
        self._node(addr, dev)
        return True

    def _node(self, laddr: IPAddress, dev: str) -> IbNode:
        kwargs: dict[str, object] = {
            "local_map": self.host.local_cong_map(laddr),
            "ping_enable": bool(self.host.config.sysctl["ping_enable"]),
        }
        kwargs.update(self.engine_kwargs)
        node = IbNode(
            self.verbs,
            self.loop,
            laddr,
            on_events=lambda peer, events: self._events(laddr, peer, events),
            listen=self.listen,
            port=self.port if laddr.version == 4 else self.port6,
            clock=self.clock,
            max_peers=MAX_PEERS,
            engine_kwargs=kwargs,
        )
        try:
            node.start()
        except VerbsError as exc:
            # rdma_cm reports a port bound already as EADDRNOTAVAIL (cma_check_port; what 7.3 with rds_rdma
            # loaded gives), a socket-like stack as EADDRINUSE; the address itself passed rdma_bind_addr
            if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                log.warning(
                    "RDS/IB %s (%s): rdma_cm port %d is taken (%s; the kernel's rds_rdma listens on it): "
                    "active only, peers cannot connect to this address",
                    laddr,
                    dev,
                    node.port,
                    errno.errorcode.get(exc.errno, exc.errno),
                )
            else:
                log.warning("RDS/IB %s (%s): cannot listen (%s): active only", laddr, dev, exc)
        else:
            if self.listen:
                log.info("RDS/IB %s (%s): listening on rdma_cm port %d", laddr, dev, node.port)
        self.nodes[laddr] = node
        return node

    # -- events of the nodes
    def _events(self, laddr: IPAddress, peer: IPAddress, events: list[IbEvent]) -> None:
        host = self.host
        for ev in events:
            match ev:
                case MessagesAcked(messages=acked):
                    self._release(laddr, peer, (m.seq for m in acked))
                case SequenceGap():
                    host.rdma_sync_mrs(laddr)  # a silent op's WRITE may have landed: before delivery
                case MessageReceived(header=h, payload=payload):
                    now = time.monotonic_ns()
                    inc = Incoming(
                        peer, laddr, h.sport, h.dport, payload, h.sequence, 0, lat=(now, now, now, 0)
                    )
                    if h.exthdr:
                        _rdma_exthdrs(inc, h.exthdr)
                    if not host.deliver(inc):
                        host.counters["ib_recv_over_cap"] += 1
                        self._hold(laddr, peer, h.dport)
                case RdmaCompleted(op=op, status=status, data=data):
                    host.rdma_complete(op, status, data)
                case CongMapReceived(map=cmap):
                    host.peer_cong_map(peer, cmap)
                case PingReceived() | DuplicateDropped():
                    count_receive_event(host.counters, ev)
                case PeerGenChanged(flushed=flushed):
                    self._release(laddr, peer, (m.seq for m in flushed))
                case NpathsNegotiated() | PongReceived() | CongMapDropped():
                    pass  # one path; a map of the wrong length is ignored

    def _hold(self, laddr: IPAddress, peer: IPAddress, dport: int) -> None:
        """The socket at (``laddr``, ``dport``) went over its receive cap with a message from ``peer``: it
        holds that connection (:meth:`IbConnection.hold_receive`) until it drained to half its cap or closed
        (``Stack.hold_reader`` calls the release then, once). A socket holds a connection once, however many
        of the frames posted before the hold still arrive for it."""
        node = self.nodes.get(laddr)
        conn = node.conns.get(peer) if node is not None else None
        if conn is None or conn.state == ConnState.CLOSED:
            return
        sock = (laddr, dport)
        if sock in conn.rx_holds:
            return
        if self.host.hold_reader(laddr, dport, id(conn), lambda: conn.release_receive(sock)):
            conn.hold_receive(sock)

    def _release(self, laddr: IPAddress, peer: IPAddress, seqs: Iterable[int]) -> None:
        pending = self.pending.get((laddr, peer))
        if not pending:
            return
        for seq in seqs:
            msg = pending.pop(seq, None)
            if msg is not None:
                self.host.acked(msg)

    # -- the Transport interface
    def transmit(self, msg: Outgoing, hash_key: HashKey) -> None:
        del hash_key  # one path (t_mp_capable = 0)
        key = _pair(msg.saddr, msg.daddr)
        if key is None:
            raise OSError(errno.EAFNOSUPPORT, "RDS/IB: source and destination of different families")
        laddr, faddr = key
        node = self.nodes.get(laddr)
        if node is None:
            raise OSError(errno.EADDRNOTAVAIL, f"RDS/IB: {laddr} has no RDMA device")
        exthdr: list[ExtHeader] = []
        if msg.rdma is not None:  # rds_ib_xmit: the r_key of the op goes with the message
            exthdr.append(ExtHeader.rdma(msg.rdma.rkey))
        if msg.rdma_cookie:
            exthdr.append(ExtHeader.rdma_dest(msg.rdma_cookie & 0xFFFFFFFF, msg.rdma_cookie >> 32))
        try:
            engine = node.engine(faddr)
            seq = engine.queue(msg.sport, msg.dport, msg.payload, exthdr=exthdr, rdma=msg.rdma)
        except (ValueError, SendQueueFull) as exc:
            raise OSError(errno.ENOBUFS, f"RDS/IB: {exc}") from exc
        msg.seq = seq
        if msg.sock_id:
            self.pending.setdefault((laddr, faddr), {})[seq] = msg
        if self._corked is not None:
            self._corked[(laddr, faddr)] = None
        else:
            node.connect(faddr)

    def get_mr(self, laddr: IPAddress, faddr: IPAddress, length: int) -> MemoryRegion:
        """``rds_ib_get_mr`` for a message to ``faddr``: ``length`` bytes registered for remote access on
        that connection's queue pair (the kernel posts its FRWR registration there). No connection up:
        ENODEV in the kernel, which ``rds_cmsg_send`` returns as EAGAIN after starting the connection."""
        key = _pair(laddr, faddr)
        node = self.nodes.get(key[0]) if key is not None else None
        if node is None or key is None:
            raise StackError(errno.ENODEV)
        peer = key[1]
        conn = node.conns.get(peer)
        if conn is None or conn.state != ConnState.UP or conn.qp is None:
            node.connect(peer)  # rds_conn_connect_if_down
            raise StackError(errno.EAGAIN)
        try:
            return conn.qp.reg_mr(length, remote=True)
        except VerbsError as exc:
            log.warning("RDS/IB %s->%s: MR registration of %d bytes failed: %s", laddr, faddr, length, exc)
            raise StackError(errno.ENOMEM) from exc

    def cork(self) -> None:
        self._corked = {}

    def uncork(self) -> None:
        corked, self._corked = self._corked, None
        for laddr, faddr in corked or ():
            node = self.nodes.get(laddr)
            if node is not None:
                node.connect(faddr)  # posts on the connection, or dials

    def cancel(self, msgs: Sequence[Outgoing]) -> None:
        """``rds_send_drop_to`` (RDS_CANCEL_SENT_TO, close): each of ``msgs`` this transport holds leaves its
        connection's send queue (never sent) or retransmit queue (never sent again), its RDMA op is not
        posted; fragments posted already still complete. One :meth:`IbEngine.cancel_many` per connection."""
        for key, seqs in self._held_seqs(msgs).items():
            node = self.nodes.get(key[0])
            engine = node.engines.get(key[1]) if node is not None else None
            if engine is not None:
                engine.cancel_many(seqs)

    def _held_seqs(self, msgs: Sequence[Outgoing]) -> dict[Key, set[int]]:
        """The sequence numbers of those of ``msgs`` a connection holds, by connection, forgotten here."""
        held: dict[Key, set[int]] = {}
        for msg in msgs:
            key = _pair(msg.saddr, msg.daddr)
            if key is None:
                continue
            pending = self.pending.get(key)
            if pending is None or pending.get(msg.seq) is not msg:
                continue
            del pending[msg.seq]
            held.setdefault(key, set()).add(msg.seq)
        return held

    def cong_map_changed(self, laddr: IPAddress) -> None:
        """rds_cong_queue_updates: the map goes to every peer connected from ``laddr``; a connection made
        later sends it when it comes up."""
        node = self.nodes.get(normalize(laddr))
        if node is None:
            return
        for faddr, engine in node.engines.items():
            if engine.state == PathState.UP:
                engine.queue_cong_map()
                node.connect(faddr)

    def reset(self) -> None:
        for node in self.nodes.values():
            for conn in list(node.conns.values()):
                conn.close("reset")

    def busy(self) -> bool:
        return any(
            node.conns or any(e.path.queued_msgs for e in node.engines.values())
            for node in self.nodes.values()
        )

    def close(self) -> None:
        self.closed = True
        for node in self.nodes.values():
            node.close()
        self.nodes.clear()
        self.pending.clear()

    # -- info tables
    def info_connections(self) -> Iterable[ConnectionRow]:
        rows: list[ConnectionRow] = []
        for laddr, node in self.nodes.items():
            for faddr, engine in node.engines.items():
                st = engine.state
                flags = (InfoConnectionFlag.CONNECTED if st == PathState.UP else 0) | (
                    InfoConnectionFlag.CONNECTING if st == PathState.CONNECTING else 0
                )
                path = engine.path
                rows.append(
                    ConnectionRow(
                        path.next_tx_seq, path.next_rx_seq, laddr, faddr, "infiniband", int(flags), 0
                    )
                )
        return rows

    def info_messages(self, retransmit_only: bool) -> Iterable[MessageRow]:
        rows: list[MessageRow] = []
        for laddr, node in self.nodes.items():
            for faddr, engine in node.engines.items():
                path = engine.path
                src = path.unacked if retransmit_only else path.unsent + path.unacked
                rows.extend(MessageRow(m.seq, m.length, laddr, faddr, m.sport, m.dport, 0) for m in src)
        return rows

    def info_tcp_sockets(self) -> Iterable[TcpSocketRow]:
        return []

    def info_rdma_connections(self) -> Iterable[RdmaConnectionRow]:
        """One row per connection (engine), as ib.c ``rds_ib_conn_info_visitor`` fills it: addresses, tos and
        sl always; GIDs, ring sizes, max_send_sge (and, in the kernel, the MR pool and cache figures) only
        while the connection is UP, zero otherwise (the kernel leaves those fields unwritten then). Our
        choices where the kernel's figure does not exist here (docs/userspace.md): rdma_mr_max and
        rdma_mr_size 0 (no MR pool: each MR is registered on its own), cache_allocs 0 (receive buffers are one
        registered region, never allocated from a cache), sl = tos & 0xF (``TOS_TO_SL``)."""
        rows: list[RdmaConnectionRow] = []
        for laddr, node in self.nodes.items():
            for faddr, engine in node.engines.items():
                conn = node.conns.get(faddr)
                up = engine.state == PathState.UP and conn is not None and conn.state == ConnState.UP
                src, dst = conn.gids if up and conn is not None else (_NO_GID, _NO_GID)
                sge = min(conn.device_max_sge, RDS_IB_MAX_SGE) if up and conn is not None else 0
                rows.append(
                    RdmaConnectionRow(
                        laddr,
                        faddr,
                        src,
                        dst,
                        engine.send_wr if up else 0,
                        engine.recv_wr if up else 0,
                        sge,
                        0,
                        0,
                        engine.tos,
                        engine.tos & 0xF,
                        0,
                    )
                )
        return rows

    def stat_counters(self) -> Counter[str]:
        """What every node counted (RDS_INFO_COUNTERS shows the ``rds_ib_stat_names`` among them)."""
        total: Counter[str] = Counter()
        for node in self.nodes.values():
            total.update(node.stat_counters())
        return total
