"""Congestion, binding and the info tables across network namespaces that carry the same address.

The kernel keeps one congestion map per address for the whole host (cong.c's rds_cong_tree, keyed by
address alone): a port congested in one namespace is refused with ENOBUFS to senders in another namespace
with the same address (docs/kernel-vs-facts.md row 19). The userspace stack is one stack per namespace, with
its own maps, so there the other namespace's senders get through. The kernel's bind table is host-wide too:
the other namespace cannot bind that port number on that address (EADDRINUSE, 6.1 and 7.3). The scenario
records both (observations ``congested_across_namespaces``, ``bind_across_namespaces``); everything else it
asserts holds on both backends.

The info tables (RDS_INFO_SOCKETS, RDS_INFO_RECV_MESSAGES, RDS_INFO_CONNECTIONS) read host-wide lists in the
kernel (rds_sock_list, rds_conn_hash). A patch posted to linux-rdma in May 2026 filters their rows by the
caller's namespace (Debian's 6.1.190-1 carries it: "rds: filter RDS_INFO_* getsockopt by caller's netns",
CVE-2026-97476); a kernel without it lists, to a socket in X, Y's sockets, their queued messages and Y's
connections. The userspace stack is one per namespace and lists its own. The second scenario records, per
table, whether X lists what Y holds (``listed_across_namespaces_*``: False on 6.1.0-57, 6.12.118 and 7.3.4,
and on the userspace stack); that Y lists its own, and X its own, holds on both.

A message that arrives over RDS/TCP in namespace X for a port that only namespace Y's socket holds (on the
same address): the kernel looks the port up in its host-wide bind table. Debian's 6.1.187-1 carries "rds:
drop incoming messages that cross network namespace boundaries" (CVE-2026-68335); a kernel without it hands
the message to Y's socket. The userspace stack of X has no such socket and drops it. The third scenario
records whether Y's socket got it (``delivered_across_namespaces``: False on 6.1.0-57, 6.12.118 and 7.3.4,
and on the userspace stack), and whether Y's RDS_INFO_TCP_SOCKETS lists X's connection from S
(``listed_across_namespaces_tcp_sockets``: False on those three kernels and the userspace stack); that X's
own socket gets the message sent after it, on the same connection, and that X's table lists that
connection, holds on both.

The send-queue scenario uses X alone: a message queued for an address nobody has, as the send-queue tables
list it (``v4_send_row_addresses``: the IPv4 table gives no addresses, on the kernels and the userspace
stack). The retransmit-table scenario uses S and X: a message sent while X's acknowledgements are held back
by netem, as the retransmit tables list it (``v4_retrans_row_addresses``: no addresses in the IPv4 table
either).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from pyrds import netns
from pyrds.constants import InfoType
from pyrds.testing.agent import Agent
from pyrds.testing.helpers import send_until_enobufs, wait_for, wait_readable
from pyrds.testing.topology import (
    delete_node_netns,
    netns_supported,
    redirect_standard_port,
    scratch_address,
    userspace_port_env,
    worker_index,
)


class _Side:
    def __init__(self, ns: str, backend: str, listens: bool = False) -> None:
        """``listens``: peers reach this namespace's stack on the standard port (a userspace stack listens
        on another where the kernel's rds_tcp holds it: topology.redirect_standard_port)."""
        self.ns = ns
        env = userspace_port_env(backend)
        if listens:
            redirect_standard_port(ns, env)
        self.agent = Agent(ns, env=env, name=f"{ns}:{backend}")
        self.backend = backend

    def socket(self) -> Any:
        return self.agent.socket(self.backend)


@contextlib.contextmanager
def _namespaces(
    names: list[str], links: list[tuple[int, int, list[str], list[str]]], backend: str, listener: int = -1
) -> Iterator[list[_Side]]:
    """The namespaces ``names``, a veth pair per link (the indexes of its two namespaces, the same for a
    pair inside one, and each end's addresses: interfaces rdsv0, rdsv1, ...), an agent of ``backend`` in
    each (``listener``: the index of the one peers dial, _Side's ``listens``); all removed afterwards."""
    reason = netns_supported()
    if reason:
        pytest.skip(reason)
    made: list[str] = []
    sides: list[_Side] = []
    try:
        for ns in names:
            made.append(netns.create_netns(ns))
        for n, (a, b, addrs_a, addrs_b) in enumerate(links):
            ifa, ifb = f"rdsv{2 * n}", f"rdsv{2 * n + 1}"
            netns.create_veth(names[a], names[b], ifa, ifb, addrs_a=addrs_a, addrs_b=addrs_b)
        for i, ns in enumerate(names):
            sides.append(_Side(ns, backend, listens=i == listener))
        yield sides
    finally:
        for side in sides:
            side.agent.close()
        for ns in made:
            delete_node_netns(ns)


@pytest.fixture
def two_namespaces(rds_backend: str) -> Iterator[tuple[_Side, _Side, str]]:
    """Namespaces X and Y, each with ``addr`` on its end of a veth pair (the link itself carries nothing:
    every send here stays inside one namespace), each with an agent of the backend."""
    addr = scratch_address(worker_index())
    tag = f"{os.getpid() % 100000}"
    cidr = [f"{addr}/24"]
    with _namespaces([f"rdsnsx{tag}", f"rdsnsy{tag}"], [(0, 1, cidr, cidr)], rds_backend) as (x, y):
        yield x, y, addr


def _refused(sock: Any, dest: tuple[str, int]) -> bool:
    """A non-blocking empty send to ``dest``: True when refused for congestion (ENOBUFS)."""
    try:
        sock.sendto(b"", dest)
    except OSError as exc:
        assert exc.errno == errno.ENOBUFS, exc
        return True
    return False


def test_congestion_across_namespaces_with_one_address(two_namespaces, rds_observe) -> None:  # type: ignore[no-untyped-def]
    x, y, addr = two_namespaces
    # namespace Y: a receiver that does not read, filled until its port is congested for Y's own sender
    receiver, sender = y.socket(), y.socket()
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    receiver.bind((addr, 0))
    sender.bind((addr, 0))
    sender.setblocking(False)
    dest = receiver.getsockname()
    _sent, congested = send_until_enobufs(sender, dest, 1024, timeout=30.0)
    assert congested and _refused(sender, dest), "the receiver's port never became congested"
    # namespace X, same address: its own receiver's port is open; what differs is the port congested in Y
    mine, probe = x.socket(), x.socket()
    mine.bind((addr, 0))
    probe.bind((addr, 0))
    probe.setblocking(False)
    assert not _refused(probe, mine.getsockname())
    across = _refused(probe, dest)
    rds_observe("congested_across_namespaces", across)
    # and the port number Y's receiver holds: can X bind it on the same address? (0 or the errno)
    twin = x.socket()
    try:
        twin.bind((addr, dest[1]))
        bound = 0
    except OSError as exc:
        bound = exc.errno
    twin.close()
    rds_observe("bind_across_namespaces", errno.errorcode.get(bound, bound) if bound else 0)
    receiver.close()
    # once Y's receiver is gone, nothing anywhere refuses that port any more
    assert not _refused(sender, dest)
    assert not _refused(probe, dest)


def test_info_tables_across_namespaces(two_namespaces, rds_observe) -> None:  # type: ignore[no-untyped-def]
    x, y, addr = two_namespaces
    ip = ipaddress.ip_address(addr)
    # namespace Y: a receiver with one unread message from a sender of Y (a loopback connection in Y)
    receiver, sender = y.socket(), y.socket()
    receiver.bind((addr, 0))
    sender.bind((addr, 0))
    dest, src = receiver.getsockname(), sender.getsockname()
    sender.sendto(b"queued in Y", dest)
    assert wait_readable(receiver, 10), "the message to Y's receiver never arrived"
    # namespace X: a socket of its own on the same address, nothing sent
    probe = x.socket()
    probe.bind((addr, 0))
    mine = probe.getsockname()

    def tables(sock: Any) -> dict[str, bool]:
        """Which of Y's things ``sock``'s info tables list (each row matched by address and port)."""
        socks = sock.get_info(InfoType.RDS_INFO_SOCKETS)
        msgs = sock.get_info(InfoType.RDS_INFO_RECV_MESSAGES)
        conns = sock.get_info(InfoType.RDS_INFO_CONNECTIONS)
        return {
            "sockets": any(r.bound_addr == ip and r.bound_port == dest[1] for r in socks),
            "recv_messages": any(
                r.laddr == ip and r.lport == dest[1] and r.fport == src[1] and r.len == 11 for r in msgs
            ),
            "connections": any(r.laddr == ip and r.faddr == ip for r in conns),
        }

    own = tables(sender)
    assert own == {"sockets": True, "recv_messages": True, "connections": True}, own
    socks_x = probe.get_info(InfoType.RDS_INFO_SOCKETS)
    assert any(r.bound_addr == ip and r.bound_port == mine[1] for r in socks_x), socks_x
    for table, listed in tables(probe).items():
        rds_observe(f"listed_across_namespaces_{table}", listed)
    # read, Y's queue is empty again, whatever X saw
    assert receiver.recv(100) == b"queued in Y"
    assert not tables(sender)["recv_messages"]


@pytest.fixture
def sender_and_two_namespaces(rds_backend: str) -> Iterator[tuple[_Side, _Side, _Side, str, str]]:
    """Namespaces S, X and Y: S and X joined by a veth pair (S on ``.1``, X on ``addr`` ``.2``), Y with
    ``addr`` too, on a veth pair of its own (both ends in Y: nothing reaches Y from S); an agent of the
    backend in each."""
    net = scratch_address(worker_index()).rsplit(".", 2)[0] + ".1"  # not the other scenarios' subnet
    src, addr = f"{net}.1", f"{net}.2"
    tag = f"{os.getpid() % 100000}"
    names = [f"rdsnqs{tag}", f"rdsnqx{tag}", f"rdsnqy{tag}"]  # not the other fixture's (same process)
    links = [(0, 1, [f"{src}/24"], [f"{addr}/24"]), (2, 2, [f"{addr}/24"], [])]
    with _namespaces(names, links, rds_backend, listener=1) as (s, x, y):
        yield s, x, y, src, addr


def test_message_for_a_port_of_another_namespace(sender_and_two_namespaces, rds_observe) -> None:  # type: ignore[no-untyped-def]
    s, x, y, src, addr = sender_and_two_namespaces
    theirs = y.socket()
    theirs.bind((addr, 0))  # Y's port on the address X has too (the kernel's bind table: X cannot take it)
    ours = x.socket()
    ours.bind((addr, 0))
    ours.settimeout(60)
    sender = s.socket()
    sender.bind((src, 0))
    # the connection S -> X up, its paths negotiated, before the two messages: one sender socket, so both go
    # on one path, in order (7.x sends on the first lane only until the peer's NPATHS is known)
    sender.sendto(b"first", ours.getsockname())
    assert ours.recv(100) == b"first"
    sender.sendto(b"for Y's port", theirs.getsockname())
    sender.sendto(b"for X's port", ours.getsockname())
    # X took the second message, so it had handled the first one, delivered or dropped
    assert ours.recv(100) == b"for X's port"
    # the RDS/TCP connection S -> X: in X's RDS_INFO_TCP_SOCKETS; in Y's only without the info tables' filter
    here, there = ipaddress.ip_address(addr), ipaddress.ip_address(src)

    def tcp_rows(sock: Any) -> list[Any]:
        rows = sock.get_info(InfoType.RDS_INFO_TCP_SOCKETS)
        return [r for r in rows if r.local_addr == here and r.peer_addr == there]

    assert tcp_rows(ours), ours.get_info(InfoType.RDS_INFO_TCP_SOCKETS)
    rds_observe("listed_across_namespaces_tcp_sockets", bool(tcp_rows(theirs)))
    try:
        got = theirs.recv(100, socket.MSG_DONTWAIT)
    except OSError as exc:
        assert exc.errno == errno.EAGAIN, exc
        got = b""
    assert got in (b"", b"for Y's port"), got
    rds_observe("delivered_across_namespaces", bool(got))


def test_send_queue_tables_and_their_addresses(two_namespaces, rds_observe) -> None:  # type: ignore[no-untyped-def]
    """A message queued in X for an address of X's subnet that nobody has (its RDS/TCP connection is never
    made): RDS_INFO_SEND_MESSAGES and RDS6_INFO_SEND_MESSAGES each list it once, by port and length. The
    RDS6 table names both ends (v4-mapped); the IPv4 table gives 0.0.0.0 for both on 6.1.0-57, 6.12.118
    and 7.3.4, over RDS/TCP and RDS/IB (2026-12-04, docs/kernel-vs-facts.md row 22), and the userspace stack
    does the same. Observed: the IPv4 table's addresses of the row (``v4_send_row_addresses``)."""
    x, _y, addr = two_namespaces
    nobody = str(ipaddress.IPv4Network(f"{addr}/24", strict=False).network_address + 200)
    sock = x.socket()
    sock.bind((addr, 0))
    port = sock.getsockname()[1]
    assert sock.sendto(b"q" * 100, socket.MSG_DONTWAIT, (nobody, 4000)) == 100
    rows4 = [r for r in sock.get_info(InfoType.RDS_INFO_SEND_MESSAGES) if r.lport == port]
    rows6 = [r for r in sock.get_info(InfoType.RDS6_INFO_SEND_MESSAGES) if r.lport == port]
    assert [(r.fport, r.len) for r in rows4] == [(4000, 100)], rows4
    assert [(r.fport, r.len) for r in rows6] == [(4000, 100)], rows6
    mapped = [ipaddress.IPv6Address(f"::ffff:{a}") for a in (addr, nobody)]
    assert [rows6[0].laddr, rows6[0].faddr] == mapped, rows6
    rds_observe("v4_send_row_addresses", f"{rows4[0].laddr} -> {rows4[0].faddr}")


#: netem delay on X's end of the S-X link in the retransmit-table scenario, set once the connection is up: a
#: message S sends then stays unacknowledged (TCP's ACK and RDS's) at least this long
ACK_DELAY_MS = 5000


def test_retransmit_table_and_its_addresses(sender_and_two_namespaces, rds_observe) -> None:  # type: ignore[no-untyped-def]
    """S sends to X over RDS/TCP while X's acknowledgements are delayed by ACK_DELAY_MS (netem on X's end of
    the link): while it is unacknowledged, S's RDS_INFO_RETRANS_MESSAGES and RDS6_INFO_RETRANS_MESSAGES each
    list the message once, by port and length; the RDS6 table names both ends (v4-mapped), the IPv4 table
    gives 0.0.0.0 for both on 6.1.0-57, 6.12.118 and 7.3.4 (docs/kernel-vs-facts.md row 22). Once
    acknowledged it is listed no more. Observed: the IPv4 table's addresses of the row
    (``v4_retrans_row_addresses``).

    The tables are read until both list the message, not once right after the send: a message goes to the
    retransmit queue when it is written to its path's TCP connection, and the path this socket hashes to
    may still be connecting then. The kernel connects every path at once after the handshake
    (rds_start_mprds), as a userspace owner does to a peer that pairs paths by port (7.x, pyrds); to any
    other it dials them one at a time (proto/pathset.py), about two round trips per path. In a 6.1.0-57
    guest a single look right after the send found the userspace stack's table empty in 2 of 3 runs
    (2026-12-04, when the userspace owner dialled one at a time to every peer); a path still connecting is
    the likely cause, not confirmed."""
    if not netns.netem_available():
        pytest.skip("this kernel has no netem qdisc (sch_netem): the acknowledgements cannot be delayed")
    s, x, _y, src, addr = sender_and_two_namespaces
    sender, receiver = s.socket(), x.socket()
    sender.bind((src, 0))
    receiver.bind((addr, 0))
    receiver.settimeout(60)
    port, dest = sender.getsockname()[1], receiver.getsockname()

    def rows(table: InfoType) -> list[Any]:
        return [r for r in sender.get_info(table) if r.lport == port and r.fport == dest[1]]

    def drained() -> bool:
        return not rows(InfoType.RDS6_INFO_RETRANS_MESSAGES)

    listed: dict[int, list[Any]] = {}

    def both_listed() -> bool:
        """One pass over both tables, RDS6 first (the IPv4 one read only when RDS6 lists the message)."""
        listed[6] = rows(InfoType.RDS6_INFO_RETRANS_MESSAGES)
        listed[4] = rows(InfoType.RDS_INFO_RETRANS_MESSAGES) if listed[6] else []
        return bool(listed[6] and listed[4])

    # the connection made and its handshake done without delay; then X's acknowledgements are held back
    for warm in (b"first", b"second"):
        sender.sendto(warm, dest)
        assert receiver.recv(100) == warm
    assert wait_for(drained, timeout=60, interval=0.2), "the warm-up messages were never acknowledged"
    netns.set_netem(x.ns, "rdsv1", netns.Netem(delay_ms=ACK_DELAY_MS))
    sender.sendto(b"r" * 60, dest)
    wait_for(both_listed, timeout=60, interval=0.05)
    rows4, rows6 = listed[4], listed[6]
    assert [r.len for r in rows6] == [60], rows6
    assert [r.len for r in rows4] == [60], rows4
    mapped = [ipaddress.IPv6Address(f"::ffff:{a}") for a in (src, addr)]
    assert [rows6[0].laddr, rows6[0].faddr] == mapped, rows6
    rds_observe("v4_retrans_row_addresses", f"{rows4[0].laddr} -> {rows4[0].faddr}")
    assert receiver.recv(100) == b"r" * 60
    assert wait_for(drained, timeout=60, interval=0.2), "the message was never acknowledged"
    netns.clear_netem(x.ns, "rdsv1")
