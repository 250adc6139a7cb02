"""The loop transport (net/rds/loop.c): destinations local to the node, delivered inside the stack.

A message is received and acked at once (``rds_loop_xmit``). Each (laddr, faddr, tos) has a connection,
made on first use, that only keeps sequence numbers for the info tables. Its connect completes at once and
queues the local congestion map (``rds_connect_path_complete``), which the loop transport "sends" as
``rds_cong_map_updated(fcong, ~0)``: a map update per new loop connection, and one per change of a local map
that a loop connection uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyrds.addr import IPAddress
from pyrds.constants import InfoConnectionFlag
from pyrds.constants import Transport as TransportType
from pyrds.userspace.stack.congestion import ALL_PORTS
from pyrds.userspace.stack.ports import is_loopback
from pyrds.userspace.stack.sockstate import Incoming, Outgoing
from pyrds.userspace.stack.transport import ConnectionRow, HashKey, MessageRow, StackHost, TcpSocketRow

__all__ = ["LoopTransport"]


@dataclass
class _LoopConn:
    laddr: IPAddress
    faddr: IPAddress
    tos: int
    next_tx_seq: int = 1
    next_rx_seq: int = 1


class LoopTransport:
    kind = TransportType.LOOP
    prefer_loopback = True
    immediate = True

    def __init__(self, host: StackHost) -> None:
        self.host = host
        self._conns: dict[tuple[IPAddress, IPAddress, int], _LoopConn] = {}

    def start(self) -> None:
        pass

    def laddr_check(self, ip: IPAddress) -> bool:
        return is_loopback(ip)

    def cork(self) -> None:
        pass  # nothing is written: every message is delivered inside transmit

    def uncork(self) -> None:
        pass

    def transmit(self, msg: Outgoing, hash_key: HashKey) -> None:
        """rds_loop_xmit: the message is received and acked at once. The stack's own pong (no socket) is
        delivered without being acked and does not move the connection's ``next_rx_seq`` (as before the
        transports were split out; the kernel's rds_recv_incoming would move it)."""
        del hash_key  # one path
        conn = self._conn(msg.saddr, msg.daddr, msg.tos)
        msg.seq = conn.next_tx_seq
        conn.next_tx_seq += 1
        if msg.sock_id == 0:
            self.host.deliver(Incoming(msg.saddr, msg.daddr, msg.sport, msg.dport, b"", msg.seq, msg.tos))
            return
        conn.next_rx_seq = conn.next_tx_seq
        now = time.monotonic_ns()
        inc = Incoming(
            msg.saddr, msg.daddr, msg.sport, msg.dport, msg.payload, msg.seq, msg.tos, lat=(0, 0, now, 0)
        )
        self.host.acked(msg)
        self.host.deliver(inc)

    def _conn(self, laddr: IPAddress, faddr: IPAddress, tos: int) -> _LoopConn:
        key = (laddr, faddr, tos)
        conn = self._conns.get(key)
        if conn is None:
            conn = self._conns[key] = _LoopConn(laddr, faddr, tos)
            self.host.cong_updated(ALL_PORTS)
        return conn

    def cancel(self, msgs: Sequence[Outgoing]) -> None:
        pass  # nothing waits: every message was delivered when it was sent

    def cong_map_changed(self, laddr: IPAddress) -> None:
        if any(c.laddr == laddr for c in self._conns.values()):
            self.host.cong_updated(ALL_PORTS)

    def reset(self) -> None:
        pass

    def busy(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def info_connections(self) -> Iterable[ConnectionRow]:
        return [
            ConnectionRow(
                c.next_tx_seq,
                c.next_rx_seq,
                c.laddr,
                c.faddr,
                "loopback",
                int(InfoConnectionFlag.CONNECTED),
                c.tos,
            )
            for c in self._conns.values()
        ]

    def info_messages(self, retransmit_only: bool) -> Iterable[MessageRow]:
        return []

    def info_tcp_sockets(self) -> Iterable[TcpSocketRow]:
        return []
