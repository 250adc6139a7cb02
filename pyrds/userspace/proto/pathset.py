"""Which TCP connection is which path, and in what order an owner (re)connects its paths (sans-IO).

Every path has its own sequence space on both ends: the receiver's duplicate rule (``seq < next_rx_seq`` and
RETRANSMITTED) is only right when a path's retransmissions reach the SAME peer path as before the reconnect.
Nothing on the wire names the path, so both ends must agree on the pairing of TCP connections to paths:

* A 6.1 acceptor (``rds_tcp_accept_one_path``) gives an incoming connection the first path in state
  DOWN/ERROR and resets it when there is none. So the owner (the smaller address) must dial paths strictly in
  index order, one at a time, each only after the peer has accepted the previous one, and only when all of the
  peer's paths are down: after any path is lost the owner closes every path gracefully (FIN, then reads until
  the peer's FIN, so nothing the peer's TCP acked is thrown away) and re-dials path 0, 1, ... in order
  (:func:`next_dial`). A path counts as accepted ("confirmed") when the peer sent anything on it (a 6.1 peer
  queues its congestion map on every path's connect) or TCP acked the :data:`OWNER_PREAMBLE` the owner writes
  first on every new connection: the peer's socket is then established and queued for accept ahead of any
  later dial, and 6.1 accepts in queue order (a fixed 0.5 s wait was not enough: with the last handshake ACK
  lost, the next dial completed first and took 6.1's path k). A 5 s fallback covers a peer that never acks.
  Data is held until then, because a 6.1 acceptor that resets a connection it could not place has already
  TCP-acked what arrived on it. (Confirming by the pong to a probe sent after the retransmissions did worse in
  the guest.)
* A pyrds owner dials from a source port that names the path (:func:`dial_port`): low byte
  ``PORT_TAG | index``. A pyrds acceptor pairs such a connection by that index; if the path still holds an
  older connection, the new one waits (unread) until the old one is gone: like every kernel, an incoming
  connection never replaces a live path (anyone on the peer's host can dial from such a port). Untagged
  connections (a 6.1 kernel dialling) get the first free path, as in 6.1, or with a single path wait for
  it (:func:`accept_path`). 6.1's random source ports look tagged one time in 32: a tag counts only
  for index 0 before the handshake and never once the peer is known to be 6.1 (:meth:`TcpConn.accept`).
* 7.x (``RDS_EXTHDR_SPORT_IDX``): a 7.x dialer binds path i to a source port with ``port % 8 == i``
  (``ALIGN(port_low, 8) + group * 8 + i``), and says so with SPORT_IDX on its probe/pong. A pyrds dialer's
  tagged ports satisfy the same rule (``0xA8 | i``), and its probes carry SPORT_IDX too. Once the peer's last
  probe/pong carried SPORT_IDX, an incoming connection belongs to path ``port % npaths`` (7.x
  ``rds_tcp_accept_one_path``), whoever dialled; if that path still has a connection, the new one waits
  until the old one is gone (7.x stashes it the same way), and the old one's keepalive probe is made at
  once, so a connection the peer lost (a restart, a lost RST) is reset within about a second. To such a
  peer, once it answered our probe on path 0 (it has then read our SPORT_IDX) and path 0 is confirmed, the
  owner dials every other path at once (:func:`fan_out_dials`), as the kernel's ``rds_start_mprds`` does,
  and a lost path other than 0 is dialled again alone (``TcpConn.path_down``), as every kernel does.
  Before any handshake nothing is known: the rules above apply. At fan-out, an acceptor whose path 0 came
  from a port with ``port % npaths != 0`` drops it (the peer opened another path first), like 7.x.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from pyrds.constants import RDS_MPATH_WORKERS, HeaderFlag
from pyrds.userspace.proto.header import RDSHeader

__all__ = [
    "OWNER_PREAMBLE",
    "PORT_TAG",
    "Lane",
    "accept_path",
    "dial_port",
    "fan_out_dials",
    "is_tagged",
    "next_dial",
    "pyrds_dialer_port",
    "sport_idx_ports",
]

#: Written by the owner first on every new connection, outside the path's sequence space: seq 0 with
#: RETRANSMITTED, ports 0 -> 0, no payload. Every receiver drops it without effect (``seq < next_rx_seq`` with
#: RETRANSMITTED is an old duplicate; on a fresh path it is a ping from port 0, which is ignored), while TCP's
#: ack of it tells the owner that the peer's socket is established (see the module doc).
OWNER_PREAMBLE = RDSHeader(sequence=0, flags=HeaderFlag.RETRANSMITTED).encode()
PORT_TAG = 0xA8  # low byte of a pyrds dialer's source port: 0xA8 | index (index < 8)
_PORT_LO, _PORT_HI = 32768, 60999


class Lane(enum.IntEnum):
    """A path as the owner's connect logic sees it."""

    DOWN = 0  # no socket
    CONNECTING = 1  # dialled, or established but not yet confirmed
    CONFIRMED = 2  # the peer accepted it: data flows
    CLOSING = 3  # graceful close in progress (FIN sent, reading until the peer's FIN)


def dial_port(rand: int, index: int) -> int:
    """A source port in 32768..60999 whose low byte is ``PORT_TAG | index``; ``rand`` picks which one."""
    if not 0 <= index < RDS_MPATH_WORKERS:
        raise ValueError(f"path index {index} out of range")
    first = (_PORT_LO + 0xFF) & ~0xFF  # 32768
    blocks = (_PORT_HI - first) // 0x100
    return first + (rand % blocks) * 0x100 + (PORT_TAG | index)


def is_tagged(port: int) -> bool:
    return port & 0xF8 == PORT_TAG


def pyrds_dialer_port(peer_port: int, npaths: int, peer_is_61: bool) -> int | None:
    """``peer_port`` if it names a pyrds dialer's path, else None. 6.1 picks source ports at random, so one in
    32 looks tagged: before the handshake (``npaths`` <= 1) only a tag for path 0 is believed (a pyrds owner
    dials paths > 0 after it), and none once the dialer is known to be 6.1."""
    if peer_is_61 or not is_tagged(peer_port):
        return None
    if peer_port & 7 != 0 and npaths <= 1:
        return None
    return peer_port


def accept_path(
    peer_port: int | None, busy: Sequence[bool], sport_idx: bool = False
) -> tuple[int, bool] | None:
    """The acceptor's choice for an incoming connection: ``(path index, that path still has a connection)``,
    or None to refuse it; the caller makes a connection for a busy path wait until the path is down.
    ``peer_port``: a pyrds dialer's tagged source port, None for any other dialer.
    ``busy[i]``: path i has a connection; ``len(busy)`` is the number of usable paths (``max(1, npaths)``).
    ``sport_idx``: the peer's last probe/pong carried SPORT_IDX, so every dialer port names its path
    (``peer_port`` is then the raw source port): path ``peer_port % len(busy)``.

    A single-path dialer that is not pyrds (6.1) only dials again when its connection is dead, and it writes
    on the new connection as soon as TCP completes: refusing it would throw away what our TCP already acked,
    so the new connection is for path 0 even while the stale one is still there."""
    if sport_idx and peer_port is not None:
        if not busy:
            return None
        index = peer_port % len(busy)
        return index, busy[index]
    if peer_port is not None:
        index = peer_port & 7
        if index >= len(busy):
            return None
        return index, busy[index]
    for index, used in enumerate(busy):
        if not used:
            return index, False
    if len(busy) == 1:
        return 0, True
    return None


def sport_idx_ports(index: int, low: int, high: int, start: int) -> list[int]:
    """7.x ``rds_tcp_conn_path_connect``: the source ports naming path ``index`` in ``low..high``
    (``ALIGN(low, 8) + group * 8 + index``), beginning with group ``start`` and wrapping around."""
    if not 0 <= index < RDS_MPATH_WORKERS:
        raise ValueError(f"path index {index} out of range")
    base = (low + RDS_MPATH_WORKERS - 1) // RDS_MPATH_WORKERS * RDS_MPATH_WORKERS
    groups = max(0, (high - base + 1) // RDS_MPATH_WORKERS)
    return [base + ((start + g) % groups) * RDS_MPATH_WORKERS + index for g in range(groups)]


def next_dial(lanes: Sequence[Lane], npaths: int) -> int | None:
    """The path the owner dials next, or None: nothing while any path is closing or being connected; else the
    lowest path that is down, provided every lower path is confirmed."""
    if any(lane == Lane.CLOSING for lane in lanes):
        return None
    for index in range(max(1, npaths)):
        lane = lanes[index] if index < len(lanes) else Lane.DOWN
        if lane == Lane.CONFIRMED:
            continue
        return index if lane == Lane.DOWN else None
    return None


def fan_out_dials(lanes: Sequence[Lane], npaths: int) -> list[int]:
    """The paths the owner dials now when the peer pairs connections by source port (SPORT_IDX, and our own
    probe on this path 0 was answered, so the peer knows we do too): every path above 0 that is down, all
    at once, once path 0 is confirmed, as the kernel's ``rds_start_mprds`` connects every path after the
    handshake; nothing while any path is closing; path 0 alone (:func:`next_dial`) until it is confirmed.
    The order of the dials does not matter to such a peer: each connection's port names its path."""
    if any(lane == Lane.CLOSING for lane in lanes):
        return []
    if not lanes or lanes[0] != Lane.CONFIRMED:
        first = next_dial(lanes, npaths)
        return [] if first is None else [first]
    return [i for i in range(1, npaths) if (lanes[i] if i < len(lanes) else Lane.DOWN) == Lane.DOWN]
