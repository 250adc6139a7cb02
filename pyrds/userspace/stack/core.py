"""The stack core: sockets, port space, bind/connect/send/recv with the kernel's rules, delivery, acks.

No I/O toward peers happens here: a sent message goes to a transport chosen by :func:`select_transport`
(loop for destinations local to the node, else the network transport); transports call back through the
:class:`~pyrds.userspace.stack.transport.StackHost` methods of :class:`Stack` (:meth:`Stack.deliver` for a
received message, :meth:`Stack.acked` when a sent message is acked, congestion-map upcalls).
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from pyrds.addr import IPAddress
from pyrds.constants import MSG_ZEROCOPY, RDS_MAX_MSG_SIZE, RdmaStatus, Transport
from pyrds.userspace.config import StackConfig
from pyrds.userspace.proto.cong import CongestionMap, is_congested, next_congested_state
from pyrds.userspace.stack import ancillary, rdma
from pyrds.userspace.stack.congestion import CongestionTable
from pyrds.userspace.stack.counters import new_counters
from pyrds.userspace.stack.errors import MustWait, PushedFirst, StackError
from pyrds.userspace.stack.memory import ClientMemory, own_memory
from pyrds.userspace.stack.outbox import Outbox
from pyrds.userspace.stack.ports import PortSpace, is_local, is_loopback, normalize
from pyrds.userspace.stack.resources import RECV_MSG_OVERHEAD, recv_cap, release_memory
from pyrds.userspace.stack.sockstate import Incoming, Outgoing, SockState
from pyrds.userspace.stack.transport import Transport as StackTransport
from pyrds.userspace.stack.transport import select_transport

MSG_TRUNC = int(socket.MSG_TRUNC)
MSG_PEEK = int(socket.MSG_PEEK)
MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
#: entries of :meth:`Stack.is_local`'s one-second cache (addresses clients sent to or bound)
LOCAL_CACHE_MAX = 1024
#: a closed socket whose receive queue held at least this many charged bytes gives the memory back at once
TRIM_AFTER_BYTES = 1 << 20


def _valid_dest(ip: IPAddress) -> bool:
    """Not unspecified, multicast or the IPv4 broadcast address (remembered: checked for every send; the
    address object of the last call first, which costs no hashing)."""
    global _last_dest
    last = _last_dest
    if last is not None and last[0] is ip:
        return last[1]
    valid = _valid_dests.get(ip)
    if valid is None:
        n = normalize(ip)
        valid = not (n.is_unspecified or n.is_multicast or (n.version == 4 and int(n) == 0xFFFFFFFF))
        if len(_valid_dests) >= LOCAL_CACHE_MAX:
            _valid_dests.clear()
        _valid_dests[ip] = valid
    _last_dest = (ip, valid)
    return valid


_valid_dests: dict[IPAddress, bool] = {}
_last_dest: tuple[IPAddress, bool] | None = None


class Stack:
    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        self.counters = new_counters()
        self.ports = PortSpace()
        self.socks: dict[int, SockState] = {}
        self.cong = CongestionTable(self.counters)
        self.cong.on_local_change = self._local_map_changed
        #: the attached transports (loop, TCP), in the order they were attached
        self.transports: list[StackTransport] = []
        self._next_id = 1
        self._local_cache: dict[IPAddress, tuple[bool, float]] = {}
        #: the last :meth:`is_local`: its address object and the entry ``_local_cache`` holds for it (set by
        #: every call, the only one that changes the cache: never another entry than the cache's)
        self._local_last: tuple[IPAddress, tuple[bool, float]] | None = None
        #: the source address of the last message pushed and its ``packed`` form (a function of the address)
        self._src_packed: tuple[IPAddress | None, bytes] = (None, b"")
        #: receivers of local deliveries made while a request is served (:meth:`hold_pushes`)
        self._held: dict[int, SockState] | None = None
        #: sockets whose report page pull_reads is taking (what it calls may look again: nothing new)
        self._pulling: set[int] = set()

    # -- helpers
    def is_local(self, ip: IPAddress, scope_id: int = 0) -> bool:
        now = time.monotonic()
        last = self._local_last
        if last is not None and last[0] is ip and last[1][1] > now:
            return last[1][0]  # the cache's entry for the address object of the last call (no hashing)
        key = normalize(ip)
        hit = self._local_cache.get(key)
        if hit is not None and hit[1] > now:
            self._local_last = (ip, hit)
            return hit[0]
        val = is_loopback(key) or is_local(key, scope_id)
        if len(self._local_cache) >= LOCAL_CACHE_MAX:  # keyed by destinations clients name: keep it bounded
            self._local_cache = {k: v for k, v in self._local_cache.items() if v[1] > now}
            if len(self._local_cache) >= LOCAL_CACHE_MAX:
                self._local_cache.clear()
        entry = self._local_cache[key] = (val, now + 1.0)
        self._local_last = (ip, entry)
        return val

    def wake(self, rs: SockState) -> None:
        rs.update_readiness()

    def attach(self, transport: StackTransport) -> None:
        """Make ``transport`` available to the send path (the service attaches loop and TCP)."""
        self.transports.append(transport)

    def _transport_for(
        self, daddr: IPAddress, sock_transport: Transport | None = None
    ) -> StackTransport | None:
        """The transport of a message to ``daddr`` from a socket of ``sock_transport``. rds_conn_create keeps
        the socket's rs_transport and only a local destination turns a connection into loopback: a socket
        bound to a loopback address (the loop transport) sends every message through the loop transport, which
        delivers it here (to nobody, for a remote destination: recv_drop_no_sock). It is never dialled over
        RDS/TCP from 127.0.0.1 / ::1, which would leave a connection redialling a peer for as long as the
        service lives."""
        if sock_transport == Transport.LOOP:
            return self.transport_of(Transport.LOOP)
        return select_transport(self.transports, self.is_local(daddr), sock_transport)

    def rdma_transport(self, rs: SockState) -> Any:
        """The RDMA transport (one with ``get_mr``: RDS/IB) of a socket of IB, else None (``rs_transport``
        without ``get_mr``: TCP, loop, unbound)."""
        if rs.transport != Transport.IB or rs.bound_addr is None:
            return None
        t = self.transport_of(Transport.IB)
        return t if t is not None and hasattr(t, "get_mr") else None

    @staticmethod
    def memory_of(rs: SockState) -> ClientMemory:
        mem = rs.memory
        return mem if isinstance(mem, ClientMemory) else own_memory()

    def transport_of(self, kind: Transport) -> StackTransport | None:
        """The attached transport of ``kind`` (the first), None if none is."""
        for t in self.transports:
            if t.kind == kind:
                return t
        return None

    # -- StackHost: what transports may call
    def local_cong_map(self, laddr: IPAddress) -> CongestionMap:
        return self.cong.map_for(laddr)

    def peer_cong_map(self, faddr: IPAddress, cmap: CongestionMap) -> None:
        self._revoke_posts_to(normalize(faddr))
        self.cong.map_updated(self.cong.replace_remote(faddr, cmap), self.wake)

    def cong_updated(self, portmask: int) -> None:
        self._revoke_posts_to(None)
        self.cong.map_updated(portmask, self.wake)

    # -- socket lifetime
    def open(self) -> SockState:
        rs = SockState(self._next_id, self.config.wmem_default, self.config.rmem_default)
        # the kernel zeroes rs_cong_track, so a new socket's first poll shows POLLIN once after any map
        # update since boot; a readiness fd cannot "consume on poll", so start at the current generation
        rs.cong_gen = self.cong.generation
        rs.cong_track = self.cong.generation.value
        self._next_id += 1
        self.socks[rs.sock_id] = rs
        rs.pull = functools.partial(self.pull_reads, rs)
        return rs

    def close(self, rs: SockState) -> None:
        """rds_release: unbind, drop the receive queue, cancel queued sends, leave monitors."""
        self.pull_reads(rs)  # what the client read before it closed counts as delivered
        rs.pull = None
        rs.dead = True
        self.cong.forget(rs)
        big = rs.rcv_charge >= TRIM_AFTER_BYTES
        for inc in list(rs.recv_queue):
            self._rcvbuf_delta(rs, -len(inc.payload))
        rs.recv_queue.clear()
        rs.pushed = 0
        if rs.rcv_charge >= recv_cap(rs.rcvbuf):
            self.cong.wake_sleepers()  # a local sender refused for its cap now finds no socket
        rs.rcv_charge = 0
        self._resume_readers(rs)
        self.cong.remove_socket(rs)
        self._cancel(list(rs.sent.values()))  # rds_send_drop_to(rs, NULL)
        rs.sent.clear()
        for key in list(rs.mrs):  # rds_rdma_drop_keys
            rdma.drop_mr(rs.mrs, key)
        rs.rdma_notify.clear()
        if rs.bound_addr is not None:
            self.ports.remove(rs.bound_addr, rs.bound_port, rs.sock_id)
        self.socks.pop(rs.sock_id, None)
        if rs.readiness is not None:
            rs.readiness.close()
            rs.readiness = None
        if rs.push is not None:
            rs.push.close()
            rs.push = None
        if rs.send_waker is not None:
            rs.send_waker.close()
            rs.send_waker = None
        if big:
            release_memory()

    # -- addressing
    def bind(self, rs: SockState, ip: IPAddress, port: int, scope_id: int) -> None:
        if ip.is_unspecified or not _valid_dest(ip):
            raise StackError(errno.EINVAL)
        if ip.version == 6 and ip.is_link_local and scope_id == 0:
            raise StackError(errno.EINVAL)
        if rs.bound_addr is not None:
            raise StackError(errno.EINVAL)
        local = self.is_local(ip, scope_id)
        if rs.transport is not None:
            # rds_bind: a preset transport's laddr_check refuses the address -> ENOPROTOOPT
            if rs.transport == Transport.IB:
                ib = self.transport_of(Transport.IB)
                if ib is None or not ib.laddr_check(ip):
                    raise StackError(errno.ENOPROTOOPT)
            elif rs.transport != Transport.TCP or not local:
                raise StackError(errno.ENOPROTOOPT)
            trans: Transport = rs.transport
        else:
            # rds_trans_get_preferred: loopback addresses -> loop; then each transport's laddr_check in t_type
            # order (IB = 0 before TCP = 2): an address of an RDMA device gives RDS/IB, as in the kernel (only
            # in the initial namespace, where the service attaches IB at all; not IPv6 link-local, see docs)
            ib = None if is_loopback(ip) else self.transport_of(Transport.IB)
            if is_loopback(ip):
                trans = Transport.LOOP
            elif ib is not None and self.config.initial_netns and ib.laddr_check(ip):
                trans = Transport.IB
            elif local:
                trans = Transport.TCP
            else:
                raise StackError(errno.EADDRNOTAVAIL)
        got = self.ports.add(ip, port, rs.sock_id)
        if got < 0:
            raise StackError(-got)
        rs.transport = trans
        rs.bound_addr = normalize(ip)
        rs.bound_port = got
        rs.scope_id = scope_id

    def connect(self, rs: SockState, ip: IPAddress, port: int, v6: bool) -> None:
        mapped = isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
        if not v6:
            if ip.is_unspecified:
                raise StackError(errno.EDESTADDRREQ)
            if not _valid_dest(ip):
                raise StackError(errno.EINVAL)
        elif not _valid_dest(ip) or (not mapped and (ip.is_unspecified or ip.is_multicast)):
            raise StackError(errno.EPROTOTYPE)
        # rds_connect records a destination of either family (7.3 in a guest, 2026-11-24: an IPv4-bound
        # socket connects to ::1, and its send() reaches the socket bound there); sendmsg decides.
        rs.conn_addr = normalize(ip)
        rs.conn_port = port
        self.revoke_posts(rs)

    # -- data path
    def _send_checks(
        self,
        rs: SockState,
        plen: int,
        anc: Sequence[tuple[int, int, bytes]],
        flags: int,
        dest: tuple[IPAddress, int] | None,
    ) -> tuple[IPAddress, int, bool, Any, rdma.Plan | None]:
        """rds_sendmsg's checks, in its order, for a message of ``plen`` bytes: (daddr, dport, zerocopy,
        zerocopy cookie, what an RDMA transport's cmsgs asked for), or StackError."""
        if flags & ~(MSG_DONTWAIT | MSG_ZEROCOPY):
            raise StackError(errno.EOPNOTSUPP)
        if dest is not None:
            daddr, dport = dest
            if not _valid_dest(daddr):
                raise StackError(errno.EINVAL)
            daddr = normalize(daddr)
        else:
            daddr, dport = rs.conn_addr or ipaddress.IPv4Address(0), rs.conn_port
        if rs.bound_addr is None or (dest is None and daddr.is_unspecified):  # a dest: _valid_dest said not
            raise StackError(errno.ENOTCONN)
        # the families by class, not by the ``version`` property (two Python calls per send)
        if type(daddr) is not type(rs.bound_addr) and (dest is not None or not self.is_local(daddr)):
            # "IPv4/IPv6 address mismatch": the kernel checks it for an explicit destination only. A connected
            # one of the other family is delivered by the loop transport when local (as 7.3 does, source
            # address the bound one); a remote one the kernel would dial at the IPv6 address's low 32 bits
            # over RDS/TCP, which the stack refuses with the same errno (docs/userspace.md).
            raise StackError(errno.EOPNOTSUPP)
        if plen > RDS_MAX_MSG_SIZE or plen > rs.rds_sndbuf:
            raise StackError(errno.EMSGSIZE)
        zcopy = bool(flags & MSG_ZEROCOPY) and rs.zerocopy
        if zcopy and rs.transport != Transport.TCP:
            raise StackError(errno.EOPNOTSUPP)
        if anc and self.rdma_transport(rs) is not None:
            plan = rdma.rm_size(anc, flags, zcopy, self.memory_of(rs))
            return daddr, dport, zcopy, plan.zcookie, plan
        cookie = ancillary.check_send(anc, flags, zcopy)
        return daddr, dport, zcopy, cookie, None

    def refuse_oversize(
        self,
        rs: SockState,
        size: int,
        anc: Sequence[tuple[int, int, bytes]],
        flags: int,
        dest: tuple[IPAddress, int] | None,
    ) -> None:
        """A send of ``size`` > RDS_MAX_MSG_SIZE bytes whose payload the client did not ship: the error the
        kernel gives it (an earlier check's errno, else EMSGSIZE). Always raises."""
        self.cong.look(rs)
        if size <= RDS_MAX_MSG_SIZE:
            raise StackError(errno.EINVAL)
        self._send_checks(rs, size, anc, flags, dest)
        raise StackError(errno.EMSGSIZE)  # not reached: the size check raised

    def sendmsg(
        self,
        rs: SockState,
        payload: bytes,
        anc: Sequence[tuple[int, int, bytes]],
        flags: int,
        dest: tuple[IPAddress, int] | None,
        nonblock: bool,
        outbox: Outbox | None = None,
        posted: bool = False,
        waited: bool = False,
    ) -> int:
        """rds_sendmsg. A message for a transport that does I/O goes to ``outbox`` when one is given (the
        caller flushes it after replying), else straight to the transport. A transport that fails to take
        the message (a bug) leaves nothing accounted: the error reaches this caller.

        ``posted``: a send the client made under a grant (:meth:`grant_posts`) and returned from already.
        Its congestion test was the grant's (a map update since then voided the grant, but a send made
        before it is not refused for it); its send-buffer test is against the buffer the grant was made
        for. A post outside its grant is refused (StackError; only a client that broke the rules sees it).

        ``waited``: this blocking call already waited for a congested port (and was counted): rds_cong_wait
        counts ``cong_send_blocked`` once per call, however often the client asks again."""
        self.cong.look(rs)
        plen = len(payload)
        daddr, dport, _zcopy, cookie, plan = self._send_checks(rs, plen, anc, flags, dest)
        if nonblock is False and flags & MSG_DONTWAIT:
            nonblock = True
        if posted:
            if (daddr, dport) != rs.grant_dest or not _post_fits(rs, plen):
                raise StackError(errno.EPERM)
        elif self.cong.test(daddr, dport):
            if not nonblock:
                if not waited:
                    self.counters["cong_send_blocked"] += 1
                self.cong.sleep(rs)
                raise MustWait()
            if rs.cong_monitor:
                rs.cong_mask |= 1 << (dport % 64)
            self.counters["cong_send_error"] += 1
            self.cong.saw_congestion(rs)
            raise StackError(errno.ENOBUFS)
        elif rs.snd_bytes >= rs.rds_sndbuf:
            self.counters["send_queue_full"] += 1
            raise StackError(errno.EAGAIN)
        elif plen == 0 and rs.snd_empty >= rs.rds_sndbuf:
            # beyond the kernel, which queues empty messages without limit (they add no bytes): an empty
            # message finds the buffer full once rds_sndbuf of them are in flight (EAGAIN; a blocking
            # client waits for POLLOUT, off meanwhile: SockState.send_full)
            self.counters["send_queue_msgs_full"] += 1
            raise StackError(errno.EAGAIN)
        transport = self._transport_for(daddr, rs.transport)
        if transport is None:
            raise StackError(errno.EADDRNOTAVAIL)
        if transport.immediate and self.receiver_full(daddr, dport):
            # a local destination over its receive cap (the loop transport never congests, as in the
            # kernel, which would queue without limit): refused like a congested port
            self.counters["send_cap_refused"] += 1
            if not nonblock:
                self.cong.sleep(rs)
                raise MustWait()
            raise StackError(errno.ENOBUFS)
        assert rs.bound_addr is not None  # _send_checks: ENOTCONN otherwise
        msg = Outgoing(
            rs.sock_id, rs.bound_addr, daddr, rs.bound_port, dport, bytes(payload), rs.tos, zcookie=cookie
        )
        sent_rdma: rdma.SendResult | None = None
        if plan is not None and plan.any_rdma:
            sent_rdma = self._rdma_cmsgs(rs, anc, plan, transport, daddr)
            msg.rdma, msg.rdma_cookie = sent_rdma.op, sent_rdma.cookie
        rs.snd_bytes += plen
        if plen == 0:
            rs.snd_empty += 1
        rs.sent_any = True
        rs.sent[id(msg)] = msg
        self.counters["send_queued"] += 1
        self.counters["copy_from_user"] += 1
        if outbox is not None and not transport.immediate:
            outbox.put(transport, msg, (rs.bound_port, rs.hash_initval))
        else:
            try:
                transport.transmit(msg, (rs.bound_port, rs.hash_initval))
            except Exception:
                self.transmit_failed(msg)
                if sent_rdma is not None and sent_rdma.new_mr is not None:
                    rdma.drop_mr(rs.mrs, sent_rdma.new_mr.key)
                raise
        rs.update_readiness()
        return plen

    def _rdma_cmsgs(
        self,
        rs: SockState,
        anc: Sequence[tuple[int, int, bytes]],
        plan: rdma.Plan,
        transport: StackTransport,
        daddr: IPAddress,
    ) -> rdma.SendResult:
        """rds_cmsg_send on an RDMA transport: the MR of an RDMA_MAP is registered on the connection to
        ``daddr`` (the kernel's FRWR registration is posted on it; not up yet: ENODEV, which rds_cmsg_send
        turns into EAGAIN, and the connection is started)."""
        laddr = rs.bound_addr
        assert laddr is not None
        get_mr = getattr(transport, "get_mr", None)
        if get_mr is None:
            raise StackError(errno.EOPNOTSUPP)

        def region(length: int) -> rdma.Region:
            r: rdma.Region = get_mr(laddr, daddr, length)
            return r

        res = rdma.cmsg_send(
            anc,
            plan,
            sock_id=rs.sock_id,
            recverr=rs.recverr,
            mem=self.memory_of(rs),
            mrs=rs.mrs,
            get_mr=region,
        )
        if res.op is not None:
            self.counters["send_rdma"] += 1  # rds_cmsg_rdma_args
        return res

    def rdma_complete(self, op: rdma.RdmaOp, status: int, data: bytes = b"") -> None:
        """StackHost: an RDMA op's work request completed (``rds_rdma_send_complete``): a READ's bytes go
        to the client's vectors; the socket gets an RDS_CMSG_RDMA_STATUS if the op asked for it, once (a
        message with an RDMA op is never retransmitted: a reconnect reports it DROPPED, unless it was
        notified already). Without NOTIFY_ME, an RDMA (not atomic) op of a socket with RDS_RECVERR set is
        notified when its message is dropped (``rds_send_remove_from_sock``: ``op_notify || (op_recverr &&
        status)``; the only non-zero status reaching it is RDS_RDMA_DROPPED, from ``rds_send_xmit``'s
        to_be_dropped list; a completion's status goes out only with NOTIFY_ME: ``rds_rdma_send_complete``).
        """
        if status != 3 and not op.atomic:
            # rds_ib_send_unmap_rdma: WRITE bytes sent, READ bytes received (not for a drop; an atomic's
            # completion counts ib_atomic_* in its transport: rds_ib_send_unmap_atomic)
            self.counters["send_rdma_bytes" if op.write else "recv_rdma_bytes"] += op.nbytes
        rs = self.socks.get(op.sock_id)
        if rs is None or rs.dead:
            return
        if not op.write and status == 0 and data:
            try:
                rdma.scatter(op, data, self.memory_of(rs))
            except StackError:
                self.counters["rdma_read_writeback_failed"] += 1
                status = 4  # RDS_RDMA_OTHER_ERROR: the client's buffer is gone
        if op.notify or _recverr_notifies(op, status):
            _notify_once(rs, op, status)
            rs.update_readiness()

    def rdma_unuse(self, rs: SockState, key: int) -> None:
        """``rds_rdma_unuse(rs, key, 0)`` for a received RDS_EXTHDR_RDMA: what the peer wrote into the MR
        goes to the client (sync_mr DMA_FROM_DEVICE); a USE_ONCE MR is freed."""
        mr = rs.mrs.get(key)
        if mr is None or not self._sync_mr(rs, key, mr):
            return
        if mr.use_once:
            rdma.drop_mr(rs.mrs, key)

    def _sync_mr(self, rs: SockState, key: int, mr: rdma.MemRegion) -> bool:
        """What the peer wrote into ``mr`` goes to the client; False when the region is gone (the MR with
        it). A client that cannot be written (EFAULT) is counted, the MR kept."""
        try:
            mr.sync_from_device(self.memory_of(rs))
        except rdma.RegionGone:
            rdma.drop_mr(rs.mrs, key)
            return False
        except StackError:
            self.counters["rdma_mr_writeback_failed"] += 1
        return True

    def rdma_sync_mrs(self, laddr: IPAddress) -> None:
        """StackHost.rdma_sync_mrs. The kernel's MRs are the client's own pages, where an RDMA WRITE lands
        at once; here they are the service's registered copies, given to the client when a message names
        them (:meth:`rdma_unuse`). A silent op's message is never sent (``rds_send_xmit``), so its WRITE is
        announced by nothing but the gap it leaves in the sequence numbers: every MR the peer may write
        (RDS_RDMA_READWRITE) of the sockets bound to ``laddr`` is synced then (RC order: the WRITE landed
        before the message after the gap)."""
        laddr = normalize(laddr)
        for rs in list(self.socks.values()):
            if rs.mrs and rs.bound_addr == laddr:
                self.counters["rdma_mr_gap_sync"] += 1
                for key, mr in list(rs.mrs.items()):
                    if mr.write:
                        self._sync_mr(rs, key, mr)

    def transmit_failed(self, msg: Outgoing) -> None:
        """A transport raised instead of taking ``msg`` (a bug, logged by the caller): forget the message and
        release its send-buffer bytes, so the socket's buffer never fills with messages nobody will send."""
        self._cancel([msg])
        rs = self.socks.get(msg.sock_id)
        if rs is None or rs.sent.pop(id(msg), None) is None:
            return
        self._release(rs, len(msg.payload))
        rs.update_readiness()

    def _release(self, rs: SockState, nbytes: int) -> None:
        """One message of ``nbytes`` left ``rs.sent``: its bytes leave the socket's send buffer, and an empty
        one the count of empty messages in flight (both published for a posting client). Called once per
        message."""
        rs.snd_bytes -= nbytes
        rs.snd_released += nbytes
        if nbytes == 0:
            rs.snd_empty -= 1
            rs.snd_empty_released += 1
        if rs.grant_epoch >= 0:
            rs.publish_send()

    # -- posted sends (service/posting.py)
    def grant_posts(self, rs: SockState, dest: tuple[IPAddress, int] | None) -> int:
        """After a send to ``dest`` succeeded: the client may post further sends there without waiting,
        while the returned epoch holds (-1: no grant). Only to a remote destination over a transport that
        does I/O, where the kernel's sendmsg also returns before anything reaches the peer, and whose
        congestion the stack learns from the wire: a map update from that peer voids the grant. Never for a
        local one: its receiver's queue and congestion change within the sender's call in the kernel."""
        if rs.push is None or rs.dead or rs.bound_addr is None:
            return -1
        daddr, dport = (normalize(dest[0]), dest[1]) if dest is not None else (rs.conn_addr, rs.conn_port)
        if daddr is None or self.is_local(daddr):
            return -1
        transport = self._transport_for(daddr, rs.transport)
        if transport is None or transport.immediate:
            return -1
        # the client posts under its latest grant only, and this send came after its earlier posts: the
        # grant is replaced (the same epoch while it was live)
        live = rs.grant_epoch == rs.post_epoch
        if not live or rs.grant_dest != (daddr, dport) or rs.grant_sndbuf != rs.rds_sndbuf:
            rs.grant_epoch = rs.post_epoch
            rs.grant_dest = (daddr, dport)
            rs.grant_sndbuf = rs.rds_sndbuf
            rs.publish_send()
        return rs.post_epoch

    def revoke_posts(self, rs: SockState) -> None:
        """Void the socket's grant: its client's next send waits for the stack again."""
        if rs.grant_epoch != rs.post_epoch:
            return
        rs.post_epoch += 1
        rs.publish_send()

    def _revoke_posts_to(self, faddr: IPAddress | None) -> None:
        """A congestion map changed: void the grants to ``faddr`` (None: to anyone)."""
        for rs in self.socks.values():
            dest = rs.grant_dest
            if dest is not None and (faddr is None or dest[0] == faddr):
                self.revoke_posts(rs)  # a no-op for a grant already void

    def acked(self, msg: Outgoing) -> None:
        """A sent message is acked: release its send-buffer bytes, queue its zerocopy cookie."""
        rs = self.socks.get(msg.sock_id)
        if rs is None or rs.sent.pop(id(msg), None) is None:
            return
        self._release(rs, len(msg.payload))
        if msg.zcookie is not None:
            rs.add_zcookie(msg.zcookie)
        rs.update_readiness()

    def acks_awaited(self, msg: Outgoing) -> bool:
        """StackHost.acks_awaited: a zerocopy completion, or a send buffer half full or more, in bytes or in
        empty messages (a sender may find it full, or waits on POLLOUT, until acks release it)."""
        if msg.zcookie is not None:
            return True
        rs = self.socks.get(msg.sock_id)
        if rs is None:
            return False
        limit = rs.rds_sndbuf
        return rs.snd_bytes * 2 >= limit or rs.snd_empty * 2 >= limit

    def cancel_sent_to(self, rs: SockState, daddr: IPAddress, dport: int) -> None:
        """``rds_send_drop_to``: every unacked message of ``rs`` to ``daddr``:``dport`` leaves the socket (its
        send-buffer bytes are free) and its connection (:meth:`_cancel`); an RDMA or atomic op that asked for
        NOTIFY_ME and was not notified yet gets RDS_RDMA_CANCELED (``__rds_send_complete``), once: a later
        completion of the op notifies nothing (:meth:`rdma_complete`)."""
        daddr = normalize(daddr)
        cancelled: list[Outgoing] = []
        for key, msg in list(rs.sent.items()):
            if msg.daddr == daddr and msg.dport == dport:
                del rs.sent[key]
                self._release(rs, len(msg.payload))
                self.counters["send_canceled"] += 1
                cancelled.append(msg)
                if msg.rdma is not None and msg.rdma.notify:
                    _notify_once(rs, msg.rdma, RdmaStatus.CANCELED)
        self._cancel(cancelled)
        rs.update_readiness()

    def _cancel(self, msgs: Sequence[Outgoing]) -> None:
        """``msgs`` leave their connections (:meth:`Transport.cancel`): one call per transport for all."""
        if not msgs:
            return
        for transport in self.transports:
            transport.cancel(msgs)

    def deliver(self, inc: Incoming) -> bool:
        """rds_recv_incoming after sequence checks: pings, lookup, queueing, congestion accounting.

        False when the receiving socket's queue is now over its cap (:func:`recv_cap`): a transport that
        can stop reading the connection the message came on does (:meth:`hold_reader`). The message itself
        was queued."""
        if inc.dport == 0 and self.config.sysctl["ping_enable"]:
            if inc.sport == 0:
                return True
            self.counters["recv_ping"] += 1
            self.counters["send_pong"] += 1
            self._pong(inc)
            return True
        sock_id = self.ports.lookup(inc.daddr, inc.dport)
        rs = self.socks.get(sock_id) if sock_id is not None else None
        if rs is None:
            self.counters["recv_drop_no_sock"] += 1
            return True
        if rs.dead:
            self.counters["recv_drop_dead_sock"] += 1
            return True
        if rs.push is not None:
            self.pull_reads(rs)  # the queue's accounting as the client's reads left it
        if inc.rdma_key is not None:
            self.rdma_unuse(rs, inc.rdma_key)
        if inc.rdma_cookie:
            inc.pushable = False  # recvmsg adds RDS_CMSG_RDMA_DEST
            inc.read_ack = None
        self.counters["recv_queued"] += 1
        size = len(inc.payload)
        self._rcvbuf_delta(rs, size)
        rs.rcv_charge += size + RECV_MSG_OVERHEAD
        if rs.timestamp:
            inc.rx_tstamp_ns = time.time_ns()
        inc.lat = (inc.lat[0], inc.lat[1], time.monotonic_ns(), 0)
        rs.recv_queue.append(inc)
        rs.queued_total += 1
        rs.publish_counts()
        held = self._held
        if held is not None:
            held[rs.sock_id] = rs  # a sender's request is being served: after its reply (:meth:`hold_pushes`)
        elif rs.push is not None:
            self.push_ready(rs)  # into the data channel before the readiness fd says readable
        rs.update_readiness()
        return rs.rcv_charge < recv_cap(rs.rcvbuf)

    def hold_pushes(self) -> None:
        """Until :meth:`release_pushes`, local deliveries are not pushed: no receiver reads a message before
        its sender was told it was sent (a service killed in between then leaves no message read that was
        never sent). The receiver is readable at once, as the kernel's is when sendto returns: a recv then
        asks the service, which answers only after the reply and the push (PushedFirst: read them)."""
        self._held = {}

    def release_pushes(self) -> None:
        held, self._held = self._held, None
        if held:
            for rs in held.values():
                if not rs.dead:
                    self.push_ready(rs)
                    rs.update_readiness()

    def push_ready(self, rs: SockState) -> None:
        """Push the queued messages the client has not been given yet, in order, while the socket may push
        (:meth:`SockState.may_push`) and the channel takes them; stops at the first message too large for it
        (served by request once the pushed ones are read)."""
        sink = rs.push
        queue = rs.recv_queue
        queued = len(queue)  # pushing does not change the queue
        if sink is None or rs.pushed >= queued or not rs.may_push():
            return
        ready = rs.readiness
        if ready is not None and ready.unconfirmed:
            ready.delivered(rs.taken_seen & 0xFFFFFFFF)  # the last byte arrived before anything after it
        while rs.pushed < queued:
            inc = queue[rs.pushed]
            if not inc.pushable:
                if inc.read_ack is None or not inc.read_ack.acked:
                    return
                inc.pushable = True
            if len(inc.payload) > sink.max_payload:
                return
            # not rs.hist_pollin(), inline (a socket that never saw congestion: no call)
            tail = rs.pushed + 1 == queued and not (
                rs.seen_congestion and not rs.cong_monitor and rs.cong_updated_since()
            )
            # the update_readiness that follows every push_ready makes an empty fd readable for the tail: say
            # so, so that a client that reads the message before that byte is there waits for it
            byte_follows = tail and ready is not None and not ready.readable
            src = self._src_packed
            if src[0] is not inc.saddr:  # a connection's messages share one address object
                src = self._src_packed = (inc.saddr, inc.saddr.packed)
            if not sink.push(src[1], inc.sport, rs.scope_id, inc.payload, tail, byte_follows):
                return
            rs.pushed += 1
            self.counters["recv_pushed"] += 1

    def push_acked(self, daddr: IPAddress, dport: int) -> None:
        """A transport learnt that messages it delivered to the socket bound at (``daddr``, ``dport``) earlier
        as not pushable (their ``read_ack``) may be pushed now: push what waits."""
        rs = self._bound_sock(daddr, dport)
        if rs is None or rs.dead or rs.push is None:
            return
        if self._held is not None:
            self._held[rs.sock_id] = rs  # pushed after the reply being served (:meth:`hold_pushes`)
            return
        self.push_ready(rs)
        rs.update_readiness()

    def consume(self, rs: SockState, count: int, drained: bool, ready_taken: int | None = None) -> None:
        """The client read ``count`` pushed messages from its data channel (a CONSUMED notice): recvmsg's
        accounting for each, then push what waits; ``drained``: the client emptied its readiness fd, and
        ``ready_taken`` is what it ever took from it (None: not said). StackError(EINVAL) when it claims
        more than was pushed (nothing is changed)."""
        if not 0 < count <= rs.pushed:
            raise StackError(errno.EINVAL)
        self._take_reads(rs, count, drained, ready_taken)

    def pull_reads(self, rs: SockState) -> None:
        """Take the reads the client's report page (rpc.REPORT_PAGE) shows since the last look, as a CONSUMED
        notice of them would be. A read count that is not a number of pushed messages is ignored (the page is
        the client's: one that writes nonsense only keeps its own queue full)."""
        sink = rs.push
        if sink is None or rs.sock_id in self._pulling:
            return
        read, taken = sink.reported()
        count = read - rs.reads_seen
        drained = taken != rs.taken_seen
        if not 0 <= count <= rs.pushed:
            count = 0
        if not count and not drained:
            return
        self._pulling.add(rs.sock_id)
        try:
            rs.reads_seen += count
            rs.taken_seen = taken
            self._take_reads(rs, count, drained, taken & 0xFFFFFFFF)
        finally:
            self._pulling.discard(rs.sock_id)

    def _take_reads(self, rs: SockState, count: int, drained: bool, ready_taken: int | None) -> None:
        """recvmsg's accounting for ``count`` messages the client read from its channel, then push what
        waits; ``drained``: it emptied its readiness fd, ``ready_taken`` the bytes it ever took from it."""
        if count:
            self.cong.look(rs)
            for _ in range(count):
                rs.consumed_charge += len(rs.recv_queue[0].payload) + RECV_MSG_OVERHEAD
                self._dequeue(rs)
            rs.pushed -= count
            if rs.push is not None:
                rs.push.unblock(count, rs.pushed)  # the client's reads made room in its channel
            self.counters["recv_delivered"] += count
            self.counters["copy_to_user"] += count
        if drained:
            # before the push: a queue that still holds input gets its byte first, so a client that reads
            # the pushed tail at once finds the byte there when it empties the fd (PUSH_BYTE_FOLLOWS)
            rs.resync_readiness(ready_taken)
        self.push_ready(rs)
        rs.update_readiness()

    def _dequeue(self, rs: SockState) -> Incoming:
        inc = rs.recv_queue.popleft()
        size = len(inc.payload)
        self._rcvbuf_delta(rs, -size)
        charge = rs.rcv_charge
        rs.rcv_charge = charge - size - RECV_MSG_OVERHEAD
        if self.cong.sleepers and charge >= recv_cap(rs.rcvbuf) > rs.rcv_charge:
            self.cong.wake_sleepers()  # a local sender refused for this receiver's cap may send again
        if rs.rcv_waiters and rs.rcv_charge <= recv_cap(rs.rcvbuf) // 2:
            self._resume_readers(rs)
        elif rs.congested or rs.rcv_waiters:
            rs.sync_reads()  # a read by request moves the sync point (the client's count does not see it)
        return inc

    def _bound_sock(self, daddr: IPAddress, dport: int) -> SockState | None:
        """The socket bound at (``daddr``, ``dport``), if any (dead ones included)."""
        sock_id = self.ports.lookup(normalize(daddr), dport)
        return self.socks.get(sock_id) if sock_id is not None else None

    def receiver_full(self, daddr: IPAddress, dport: int) -> bool:
        """The socket bound at (``daddr``, ``dport``) holds a receive queue over its cap."""
        rs = self._bound_sock(daddr, dport)
        if rs is None or rs.dead:
            return False
        self.pull_reads(rs)
        return rs.rcv_charge >= recv_cap(rs.rcvbuf)

    def hold_reader(self, daddr: IPAddress, dport: int, key: int, resume: Callable[[], None]) -> bool:
        """A transport stops reading a connection because the socket bound at (``daddr``, ``dport``) is over
        its receive cap: ``resume`` is called once, when that queue drained to half the cap or the socket
        closed (one waiter per ``key``). False, and nothing registered, when the socket is not over its cap
        (any more): the caller keeps reading."""
        rs = self._bound_sock(daddr, dport)
        if rs is None or rs.dead or rs.rcv_charge < recv_cap(rs.rcvbuf):
            return False
        rs.rcv_waiters[key] = resume
        self.counters["recv_cap_hold"] += 1
        rs.sync_reads()
        return True

    def _resume_readers(self, rs: SockState) -> None:
        waiters = list(rs.rcv_waiters.values())
        rs.rcv_waiters.clear()
        rs.sync_reads()
        for resume in waiters:
            resume()

    def _pong(self, ping: Incoming) -> None:
        """rds_send_pong: a message from port 0 to the pinger (no socket: sock_id 0), on path 0."""
        transport = self._transport_for(ping.saddr)
        if transport is not None:
            transport.transmit(Outgoing(0, ping.daddr, ping.saddr, 0, ping.sport, b"", ping.tos), (0, 0))

    def _rcvbuf_delta(self, rs: SockState, delta: int) -> None:
        if delta == 0:
            return
        rs.rcv_bytes += delta
        key = "recv_bytes_added_to_sock" if delta > 0 else "recv_bytes_freed_fromsock"
        self.counters[key] += delta if delta > 0 else -delta
        if rs.transport == Transport.LOOP or rs.bound_addr is None:
            return
        if not rs.congested and not is_congested(rs.rcv_bytes, rs.rcvbuf):
            return  # next_congested_state's answer for the usual case, with the rule kept in proto/cong.py
        now = next_congested_state(rs.congested, rs.rcv_bytes, rs.rcvbuf)
        if now != rs.congested:
            rs.congested = now
            self.cong.set_local(rs.bound_addr, rs.bound_port, now)
            rs.sync_reads()

    def _local_map_changed(self, laddr: IPAddress) -> None:
        self.counters["cong_update_queued"] += 1
        for transport in self.transports:
            transport.cong_map_changed(laddr)

    def recvmsg(
        self, rs: SockState, bufsize: int, ancbufsize: int, flags: int, nonblock: bool
    ) -> tuple[bytes, list[tuple[int, int, bytes]], int, Any]:
        self.cong.look(rs)
        if flags & socket.MSG_OOB:
            raise StackError(errno.EOPNOTSUPP)
        del nonblock  # the client waits for POLLIN itself; the service never blocks
        out = ancillary.AncBuilder(ancbufsize)
        if rs.rdma_notify:
            # rds_notify_queue_get: as many as fit whole (at least one; truncated: MSG_CTRUNC, consumed)
            fit = max(1, ancbufsize // socket.CMSG_SPACE(16))
            for _ in range(min(fit, len(rs.rdma_notify))):
                token, status = rs.rdma_notify.popleft()
                out.put_rdma_status(token, status)
            rs.update_readiness()
            return b"", out.items, out.msg_flags, None
        if rs.cong_notify:
            notify = rs.cong_notify
            if out.put_cong(notify):
                rs.cong_notify &= ~notify
            rs.update_readiness()
            return b"", out.items, out.msg_flags, None
        if rs.pushed:
            raise PushedFirst()
        if not rs.recv_queue:
            if rs.zcookies and out.put_zcookies(rs):
                rs.update_readiness()
                return b"", out.items, out.msg_flags, None
            raise StackError(errno.EAGAIN)
        inc = rs.recv_queue[0]
        data = inc.payload[:bufsize]
        msg_flags = 0
        if len(data) < len(inc.payload):
            msg_flags |= MSG_TRUNC
        if not flags & MSG_PEEK:
            self._dequeue(rs)
            rs.served_total += 1
            rs.publish_counts()
        out.put_recv(rs, inc)
        out.put_zcookies(rs)
        self.counters["recv_delivered"] += 1
        self.counters["copy_to_user"] += 1
        if rs.push is not None:
            # nothing pushed waits in the channel (PushedFirst above): it has room, whatever found it full
            rs.push.unblock(0, 0)
            self.push_ready(rs)
        rs.update_readiness()
        return data, out.items, msg_flags | out.msg_flags, (str(inc.saddr), inc.sport, rs.scope_id)


def _post_fits(rs: SockState, plen: int) -> bool:
    """A posted send of ``plen`` bytes is within its grant's send buffer, as the client must have checked it
    (service/posting.py): bytes below the buffer, and for an empty message also the empty ones in flight."""
    if rs.snd_bytes >= rs.grant_sndbuf:
        return False
    return plen > 0 or rs.snd_empty < rs.grant_sndbuf


def _recverr_notifies(op: rdma.RdmaOp, status: int) -> bool:
    """An op without NOTIFY_ME is still notified: an RDMA op (``rm->rdma``; the kernel never looks at an
    atomic's ``op_recverr``) of a RDS_RECVERR socket whose message was dropped."""
    return op.recverr and not op.atomic and status == RdmaStatus.DROPPED


def _notify_once(rs: SockState, op: rdma.RdmaOp, status: int) -> None:
    """Queue the op's RDS_CMSG_RDMA_STATUS on ``rs`` unless it went out already (the kernel clears
    ``op_notifier`` when it queues one: an op is notified once, whichever of completion, drop or cancel
    comes first)."""
    if not op.done:
        op.done = True
        rs.rdma_notify.append((op.token, int(status)))
