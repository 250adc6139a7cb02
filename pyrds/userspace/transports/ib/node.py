"""One local RDS/IB address (IPv4 or IPv6) as an endpoint: an :class:`~.engine.IbEngine` per peer, at most
one :class:`~.driver.IbConnection` each, optionally the rdma_cm listener: port 18634 for an IPv4 address,
16385 for an IPv6 one (rdma_transport.c ``rds_rdma_listen_init``: ``RDS_PORT`` with the 32-byte private
data, ``RDS_CM_PORT`` with the 56-byte one). A node's peers are of its own family.

Not wired into the stack/service: this is the unit the guest smoke test (and later the IB ``Transport``)
drives. Sending to a peer without a connection dials it; a connection that drops while messages are queued or
unacked is redialled after the kernel's backoff (threads.c ``rds_queue_reconnect``: at once, then a random
delay below a ceiling doubling from 1 ms to 1 s). Requests (ib_cm.c ``rds_ib_cm_handle_connect``) are
answered by the peer's engine: version check, address check, race and stale-connection rules. The REQ's
``dp_saddr`` names the peer; ``dp_daddr`` must be this node's address. Peers are capped at ``max_peers``
(a request from one more is rejected), and only one passive connection can be pending or UP at a time (see
:class:`~.driver.IbListener`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from pyrds.addr import IPAddress
from pyrds.userspace.proto import PathState
from pyrds.userspace.proto.backoff import ReconnectBackoff
from pyrds.userspace.transports.ib.driver import ConnState, FdLoop, IbConnection, IbListener, reject_request
from pyrds.userspace.transports.ib.engine import IbEngine
from pyrds.userspace.transports.ib.events import IbEvent
from pyrds.userspace.transports.ib.privdata import REJ_CONSUMER_DATA, ConnectPrivate
from pyrds.userspace.transports.ib.verbs import CmEvent, CmId, Verbs
from pyrds.userspace.transports.ib.wire import RDS_CM_PORT, RDS_IB_PORT

__all__ = ["IbNode"]

log = logging.getLogger("pyrds.userspace.ib")

EventSink = Callable[[IPAddress, list[IbEvent]], None]


def cm_port(addr: IPAddress) -> int:
    """The rdma_cm port of RDS/IB for ``addr``'s family: 18634 (IPv4), 16385 (IPv6)."""
    return RDS_IB_PORT if addr.version == 4 else RDS_CM_PORT


class IbNode:
    def __init__(
        self,
        verbs: Verbs,
        loop: FdLoop,
        laddr: str | IPAddress,
        *,
        on_events: EventSink | None = None,
        listen: bool = True,
        port: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        reconnect: bool = True,
        max_peers: int = 64,
        engine_kwargs: dict[str, Any] | None = None,
        backoff: Callable[[], ReconnectBackoff] = ReconnectBackoff,
    ) -> None:
        self.verbs = verbs
        self.loop = loop
        self.laddr: IPAddress = ipaddress.ip_address(laddr)
        self.on_events = on_events
        #: the rdma_cm port this node listens on and dials (None: the family's, :func:`cm_port`)
        self.port = cm_port(self.laddr) if port is None else port
        self.clock = clock
        self.reconnect = reconnect
        self.max_peers = max_peers
        self.engine_kwargs = dict(engine_kwargs or {})
        self.engines: dict[IPAddress, IbEngine] = {}
        self.conns: dict[IPAddress, IbConnection] = {}
        self.counters: Counter[str] = Counter()
        #: the counters of this node's connections that are gone (kept for RDS_INFO_COUNTERS)
        self.retired: Counter[str] = Counter()
        #: why each peer's connections ended, oldest first
        self.closed: list[tuple[IPAddress, str]] = []
        self.listener: IbListener | None = None
        self._listen = listen
        self._backoff: dict[IPAddress, ReconnectBackoff] = {}
        self._make_backoff = backoff
        self._redial_pending: set[IPAddress] = set()
        self._closing = False

    def start(self) -> None:
        """Start listening (if asked to); :class:`VerbsError` when that is impossible."""
        if self._listen:
            listener = IbListener(self.verbs, self.loop, str(self.laddr), self._on_request, port=self.port)
            listener.start()
            self.listener = listener

    # -- peers ----------------------------------------------------------------------------------------------
    def _peer(self, faddr: str | IPAddress) -> IPAddress:
        """``faddr`` as an address of this node's family (ValueError otherwise)."""
        peer = ipaddress.ip_address(faddr)
        if peer.version != self.laddr.version:
            raise ValueError(f"{peer}: not an IPv{self.laddr.version} address")
        return peer

    def engine(self, faddr: str | IPAddress) -> IbEngine:
        peer = self._peer(faddr)
        engine = self.engines.get(peer)
        if engine is None:
            if len(self.engines) >= self.max_peers:
                raise ValueError(f"more than {self.max_peers} peers")
            engine = IbEngine(self.laddr, peer, **self.engine_kwargs)
            self.engines[peer] = engine
        return engine

    def connection(self, faddr: str | IPAddress) -> IbConnection | None:
        return self.conns.get(ipaddress.ip_address(faddr))

    def send(self, faddr: str | IPAddress, sport: int, dport: int, payload: bytes) -> int:
        """Queue a message to ``faddr`` (dialling it if needed); returns its sequence number."""
        engine = self.engine(faddr)
        seq = engine.queue(sport, dport, payload)
        self._kick(engine.faddr)
        return seq

    def ping(self, faddr: str | IPAddress, sport: int) -> int:
        engine = self.engine(faddr)
        seq = engine.send_ping(sport)
        self._kick(engine.faddr)
        return seq

    def connect(self, faddr: str | IPAddress) -> None:
        """Dial ``faddr`` now unless a connection exists."""
        self._kick(self.engine(faddr).faddr)

    def _kick(self, peer: IPAddress) -> None:
        conn = self.conns.get(peer)
        if conn is not None and conn.state != ConnState.CLOSED:
            conn.kick()
            return
        if peer in self._redial_pending or self._closing:
            return
        engine = self.engines[peer]
        if engine.state != PathState.DOWN:
            return
        self.counters["ib_dial"] += 1
        conn = IbConnection.dial(self.verbs, engine, self.loop, self, self.clock, port=self.port)
        if conn.state != ConnState.CLOSED:
            self.conns[peer] = conn

    # -- passive side ---------------------------------------------------------------------------------------
    def _on_request(self, ev: CmEvent) -> IbConnection | None:
        assert ev.request is not None
        request = ev.request
        try:
            req = ConnectPrivate.parse(ev.private_data, ipv6=self.laddr.version == 6)
        except ValueError as exc:
            self._reject(request, "ib_bad_private_data", f"bad private data: {exc}")
            return None
        if req.daddr != self.laddr:
            self._reject(request, "ib_request_not_ours", f"request for {req.daddr}")
            return None
        peer = req.saddr
        if peer not in self.engines and len(self.engines) >= self.max_peers:
            self._reject(request, "ib_request_too_many_peers", f"request from {peer}: too many peers")
            return None
        engine = self.engine(peer)
        listener = self.listener
        if listener is not None and listener.busy and listener.passive is not None:
            if listener.passive.engine is not engine:
                self._reject(request, "ib_listener_busy", f"request from {peer}: listener busy")
                return None
        was_up = engine.state == PathState.UP
        answer = engine.on_request(ev.private_data, self.clock())
        if not answer.accept:
            log.info("%s: rejecting request from %s: %s", self.laddr, peer, answer.reason)
            self.counters["ib_rejected"] += 1
        old = self.conns.get(peer)
        if was_up and engine.state == PathState.DOWN and old is not None:
            old.close("stale: the peer connects again")
        conn = IbConnection.accept(request, answer, engine, self.loop, self, self.clock)
        if conn is not None and conn.state != ConnState.CLOSED:
            self.counters["ib_accepted"] += 1
            self.conns[peer] = conn
        return conn

    def _reject(self, request: CmId, counter: str, why: str) -> None:
        self.counters[counter] += 1
        self.counters["ib_rejected"] += 1
        log.info("%s: rejecting: %s", self.laddr, why)
        reject_request(request, REJ_CONSUMER_DATA)

    # -- ConnOwner ------------------------------------------------------------------------------------------
    def conn_events(self, conn: IbConnection, events: list[IbEvent]) -> None:
        peer = conn.engine.faddr
        if self.on_events is not None:
            self.on_events(peer, events)

    def conn_closed(self, conn: IbConnection, reason: str) -> None:
        peer = conn.engine.faddr
        self.retired.update(conn.counters)
        self.closed.append((peer, reason))
        if self.conns.get(peer) is conn:
            del self.conns[peer]
        log.info("%s: connection to %s (%s) ended: %s", self.laddr, peer, conn, reason)
        engine = conn.engine
        if self._closing or not self.reconnect or peer in self._redial_pending:
            return
        if not engine.path.queued_msgs:
            return
        backoff = self._backoff.setdefault(peer, self._make_backoff())
        if conn.counters["ib_connected"]:
            backoff.reset()  # rds_connect_path_complete: a drop after a completed connect redials at once
        delay = backoff.next_delay(self.clock())
        self._redial_pending.add(peer)
        self.counters["ib_reconnect_scheduled"] += 1

        def redial() -> None:
            self._redial_pending.discard(peer)
            self._kick(peer)

        self.loop.call_later(delay, redial)

    # -- statistics -----------------------------------------------------------------------------------------
    def stat_counters(self) -> Counter[str]:
        """Everything counted at this address: the node, its listener, its engines, its connections (live and
        gone)."""
        total: Counter[str] = Counter()
        total.update(self.counters)
        total.update(self.retired)
        if self.listener is not None:
            total.update(self.listener.counters)
        for engine in self.engines.values():
            total.update(engine.counters)
        for conn in self.conns.values():
            total.update(conn.counters)
        return total

    # -- teardown -------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._closing = True
        for conn in list(self.conns.values()):
            conn.close("node closed")
        self.conns.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
