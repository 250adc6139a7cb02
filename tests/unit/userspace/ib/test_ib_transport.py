"""The RDS/IB transport in the userspace stack (transports.ib.transport.IbTransport): two stacks on the fake
verbs fabric, sockets pinned with SO_RDS_TRANSPORT=IB, and the socket errnos of the kernel's af_rds.c and
bind.c."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import selectors
import socket

import pytest
from ib_fakeverbs import Clock, FakeFabric, FakeLoop

from pyrds.constants import SOL_RDS, InfoConnectionFlag, InfoType, SockOpt
from pyrds.constants import Transport as TransportType
from pyrds.userspace.config import StackConfig
from pyrds.userspace.stack import core, info_tables
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.outbox import Outbox
from pyrds.userspace.stack.resources import RECV_MSG_OVERHEAD
from pyrds.userspace.stack.sockopts import getsockopt, setsockopt
from pyrds.userspace.stack.sockstate import SockState
from pyrds.userspace.stack.transport import select_transport
from pyrds.userspace.transports import ib_transport, loop_transport
from pyrds.userspace.transports.ib.transport import IbTransport
from pyrds.userspace.transports.ib.verbs import CmEventKind, ConnParams, QpConfig
from pyrds.userspace.transports.ib.wire import RDS_CM_PORT, RDS_IB_PORT

A = "10.7.0.1"
B = "10.7.0.2"
NODEV = "10.7.0.9"
SMALL = {"send_wr": 8, "recv_wr": 16}


def ip(s: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(s)


class Pair:
    """Stacks A and B (each with loop + IB transports) on one fake fabric and loop."""

    def __init__(self, *, kernel_holds_port: bool = False, listen_errno: int = errno.EADDRINUSE) -> None:
        self.fabric = FakeFabric()
        self.fabric.devices = {A: "rxe0", B: "rxe0"}
        self.fabric.listen_errno = listen_errno
        self.clock = Clock()
        self.loop = FakeLoop(self.fabric, self.clock)
        if kernel_holds_port:  # someone (the kernel's rds_rdma) listens on A's 18634 already
            self.fabric.verbs().create_channel().create_id().listen(A, RDS_IB_PORT, 128)
        self.a, self.ib_a = self.stack()
        self.b, self.ib_b = self.stack()

    def stack(self, initial_netns: bool = True) -> tuple[Stack, IbTransport]:
        stack = Stack(StackConfig(initial_netns=initial_netns))
        stack.attach(loop_transport(stack))
        ib = IbTransport(stack, self.loop, self.fabric.verbs(), clock=self.clock.tick, engine_kwargs=SMALL)
        ib.start()
        stack.attach(ib)
        return stack, ib


def ib_socket(stack: Stack, addr: str, port: int) -> SockState:
    rs = stack.open()
    setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
    stack.bind(rs, ip(addr), port, 0)
    return rs


def payload(n: int, salt: int = 0) -> bytes:
    return bytes((i * 7 + salt) & 0xFF for i in range(n))


def recv_all(stack: Stack, rs: SockState) -> list[tuple[bytes, tuple[str, int]]]:
    out = []
    while True:
        try:
            data, _anc, _flags, addr = stack.recvmsg(rs, 1 << 20, 0, 0, True)
        except StackError as exc:
            assert exc.code == errno.EAGAIN
            return out
        out.append((data, (addr[0], addr[1])))


# -- socket options and bind ---------------------------------------------------------------------------------
def test_so_rds_transport_ib_needs_the_ib_transport() -> None:
    stack = Stack(StackConfig(initial_netns=True))
    stack.attach(loop_transport(stack))
    rs = stack.open()
    with pytest.raises(StackError) as ei:
        setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
    assert ei.value.code == errno.ENOPROTOOPT  # rds_trans_get: no IB transport registered
    fabric = FakeFabric()
    stack.attach(IbTransport(stack, FakeLoop(fabric, Clock()), fabric.verbs()))
    with pytest.raises(StackError) as ei:
        setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IWARP))
    assert ei.value.code == errno.ENOPROTOOPT  # no iWARP transport, IB or not
    setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
    assert getsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 0) == int(TransportType.IB)
    with pytest.raises(StackError) as ei:
        setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.TCP))
    assert ei.value.code == errno.EOPNOTSUPP  # once only


def test_so_rds_transport_ib_outside_the_initial_namespace_is_eprototype() -> None:
    pair = Pair()
    stack, _ = pair.stack(initial_netns=False)
    rs = stack.open()
    with pytest.raises(StackError) as ei:
        setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
    assert ei.value.code == errno.EPROTOTYPE


def test_bind_of_an_ib_socket_needs_an_rdma_address() -> None:
    pair = Pair()
    stack = pair.a
    for addr in (NODEV, "127.0.0.1"):
        rs = stack.open()
        setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
        with pytest.raises(StackError) as ei:
            stack.bind(rs, ip(addr), 4000, 0)
        assert ei.value.code == errno.ENOPROTOOPT  # rds_bind: the preset transport's laddr_check failed
        assert rs.bound_addr is None
    assert "127.0.0.1" not in pair.fabric.addr_checks  # loopback is never asked of verbs
    rs = ib_socket(stack, A, 4000)
    assert rs.bound_addr == ip(A) and rs.bound_port == 4000
    assert list(pair.ib_a.nodes) == [ip(A)]
    # a check that failed is not asked again at once (a client binding in a loop costs no verbs calls)
    checks = len(pair.fabric.addr_checks)
    rs2 = stack.open()
    setsockopt(stack, rs2, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
    with pytest.raises(StackError):
        stack.bind(rs2, ip(NODEV), 4001, 0)
    assert len(pair.fabric.addr_checks) == checks


def test_only_ib_pinned_sockets_select_the_ib_transport() -> None:
    pair = Pair()
    ts = pair.a.transports  # loop, IB
    assert select_transport(ts, local_dest=False) is None  # TCP sockets never get IB (IB ones: bind decides)
    assert select_transport(ts, local_dest=False, pinned=TransportType.TCP) is None
    assert select_transport(ts, local_dest=False, pinned=TransportType.IB) is pair.ib_a
    # IB does not prefer loopback (rds_ib_transport): a local peer is reached over IB too
    assert select_transport(ts, local_dest=True, pinned=TransportType.IB) is pair.ib_a
    assert select_transport(ts, local_dest=True) is ts[0]


# -- data ----------------------------------------------------------------------------------------------------
def test_the_ipv4_send_table_gives_no_addresses_and_the_rds6_one_does() -> None:
    """As the kernel (docs/kernel-vs-facts.md row 22): RDS_INFO_SEND_MESSAGES lists a queued message with
    laddr and faddr 0.0.0.0 (6.1.0-57, 6.12.118, 7.3.4; RDS/TCP, RDS/IB), ports and length as they are;
    RDS6_INFO_SEND_MESSAGES lists the same message with both addresses, v4-mapped."""
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    ib_socket(pair.b, B, 5000)
    assert pair.a.sendmsg(sa, b"x" * 100, [], 0, (ip(B), 5000), True) == 100
    (row,) = info_tables.records(pair.a, InfoType.RDS_INFO_SEND_MESSAGES)
    any4 = ipaddress.IPv4Address(0)
    assert (row.laddr, row.faddr, row.lport, row.fport, row.len) == (any4, any4, 4000, 5000, 100)
    (row6,) = info_tables.records(pair.a, InfoType.RDS6_INFO_SEND_MESSAGES)
    mapped = [ipaddress.IPv6Address(f"::ffff:{x}") for x in (A, B)]
    assert [row6.laddr, row6.faddr, row6.lport, row6.fport, row6.len] == [*mapped, 4000, 5000, 100]


def test_send_recv_acked_and_info_over_ib() -> None:
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    sb = ib_socket(pair.b, B, 5000)
    sizes = [0, 1, 4097, 65536]
    for i, n in enumerate(sizes):
        assert pair.a.sendmsg(sa, payload(n, i), [], 0, (ip(B), 5000), True) == n
    assert sa.snd_bytes == sum(sizes)
    sent_rows = info_tables.records(pair.a, InfoType.RDS_INFO_SEND_MESSAGES)
    assert [(r.seq, r.len) for r in sent_rows] == [(i + 1, n) for i, n in enumerate(sizes)]
    pair.loop.run()
    got = recv_all(pair.b, sb)
    assert got == [(payload(n, i), (A, 4000)) for i, n in enumerate(sizes)]
    # B answers: its data carries the ack of what A sent (and A's first message asked for one at once)
    for i, n in enumerate(sizes):
        pair.b.sendmsg(sb, payload(n, 100 + i)[::-1], [], 0, (ip(A), 4000), True)
    pair.loop.run()
    assert recv_all(pair.a, sa) == [(payload(n, 100 + i)[::-1], (B, 5000)) for i, n in enumerate(sizes)]
    assert sa.snd_bytes == 0 and not sa.sent  # every message acked: the send buffer is free
    assert not pair.ib_a.pending[(ip(A), ip(B))]
    assert info_tables.records(pair.a, InfoType.RDS_INFO_SEND_MESSAGES) == []
    rows = info_tables.records(pair.a, InfoType.RDS_INFO_CONNECTIONS)
    assert len(rows) == 1
    row = rows[0]
    assert (row.laddr, row.faddr, row.transport) == (ip(A), ip(B), "infiniband")
    assert row.flags & InfoConnectionFlag.CONNECTED
    assert row.next_tx_seq == len(sizes) + 1 and row.next_rx_seq == len(sizes) + 1
    rows_b = info_tables.records(pair.b, InfoType.RDS_INFO_CONNECTIONS)
    assert [(r.laddr, r.faddr, r.transport) for r in rows_b] == [(ip(B), ip(A), "infiniband")]
    assert pair.ib_a.busy()


def test_corked_sends_go_out_on_uncork_and_cancel_stops_accounting() -> None:
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    sb = ib_socket(pair.b, B, 5000)
    outbox = Outbox()
    for i in range(3):
        pair.a.sendmsg(sa, payload(10, i), [], 0, (ip(B), 5000), True, outbox)
    assert pair.ib_a.nodes[ip(A)].engines == {}  # nothing handed over before the flush
    outbox.flush(pair.a.transmit_failed)
    pair.loop.run()
    assert [d for d, _ in recv_all(pair.b, sb)] == [payload(10, i) for i in range(3)]
    setsockopt(pair.a, sa, SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, socket_addr(B, 5000))
    assert not pair.ib_a.pending[(ip(A), ip(B))]
    assert sa.snd_bytes == 0


def socket_addr(addr: str, port: int) -> bytes:
    return socket.AF_INET.to_bytes(2, "little") + port.to_bytes(2, "big") + ip(addr).packed + bytes(8)


@pytest.mark.parametrize("code", [errno.EADDRINUSE, errno.EADDRNOTAVAIL])
def test_listener_port_taken_runs_active_only(caplog: pytest.LogCaptureFixture, code: int) -> None:
    caplog.set_level(logging.WARNING, logger="pyrds.userspace.ib")
    pair = Pair(kernel_holds_port=True, listen_errno=code)
    sa = ib_socket(pair.a, A, 4000)
    node = pair.ib_a.nodes[ip(A)]
    assert node.listener is None
    assert any("active only" in r.getMessage() and "taken" in r.getMessage() for r in caplog.records)
    sb = ib_socket(pair.b, B, 5000)
    pair.a.sendmsg(sa, b"hello", [], 0, (ip(B), 5000), True)  # A dials B: fine without a listener
    pair.loop.run()
    assert recv_all(pair.b, sb) == [(b"hello", (A, 4000))]


def test_reset_and_close_drop_connections() -> None:
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    ib_socket(pair.b, B, 5000)
    pair.a.sendmsg(sa, b"x", [], 0, (ip(B), 5000), True)
    pair.loop.run()
    assert pair.ib_a.nodes[ip(A)].conns
    pair.ib_a.reset()
    assert not pair.ib_a.nodes[ip(A)].conns
    pair.loop.run()
    pair.ib_a.close()
    pair.ib_b.close()
    assert pair.ib_a.nodes == {} and not pair.ib_a.busy()
    assert not pair.ib_a.laddr_check(ip(A))  # closed: no new nodes


# -- service wiring ------------------------------------------------------------------------------------------
def test_service_without_rdma_device_attaches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyrds.userspace.service import server

    monkeypatch.setattr(server, "rdma_available", lambda: False)
    svc = server.Service(config=StackConfig(initial_netns=True))
    try:
        assert svc.start_ib() is False
        assert [t.kind for t in svc.stack.transports] == [TransportType.LOOP]
    finally:
        svc.close()


def test_service_attaches_ib_over_its_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The factory adapts the service's SelectorLoop to the driver's fd readers (a real fd: a pipe)."""
    from pyrds.userspace.service import server
    from pyrds.userspace.transports.ib.fdloop import EventFdLoop

    svc = server.Service(config=StackConfig(initial_netns=True))
    try:
        fabric = FakeFabric()
        ib = ib_transport(svc.stack, svc.loop, fabric.verbs())
        assert ib.kind == TransportType.IB and ib.prefer_loopback is False and ib.immediate is False
        adapter = EventFdLoop(svc.loop)
        r, w = os.pipe()
        seen: list[int] = []
        adapter.add_reader(r, lambda: seen.append(os.read(r, 10)[0]))
        os.write(w, b"\x07")
        svc.loop.run_once(0.5)
        assert seen == [7]
        adapter.remove_reader(r)
        assert not any(k.fd == r for k in svc.loop.sel.get_map().values())
        os.close(r)
        os.close(w)
        assert isinstance(svc.loop.sel, selectors.BaseSelector)
    finally:
        svc.close()


def test_service_start_ib_failure_propagates_for_the_daemon_to_log(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyrds.userspace.service import server

    def no_pyverbs(*_a: object, **_k: object) -> None:
        raise ImportError("No module named 'pyverbs'")

    monkeypatch.setattr(server, "rdma_available", lambda: True)
    monkeypatch.setattr(server, "ib_transport", no_pyverbs)
    svc = server.Service(config=StackConfig(initial_netns=True))
    try:
        with pytest.raises(ImportError):
            svc.start_ib()
        assert [t.kind for t in svc.stack.transports] == [TransportType.LOOP]
    finally:
        svc.close()


def test_an_ib_connection_up_keeps_an_idle_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The idle rule: with no client left, an RDS/IB connection UP keeps the stack as an RDS/TCP one does."""
    from pyrds.userspace.service import server

    pair = Pair()
    svc = server.Service(stack=pair.a)
    try:
        assert not svc._peers_connected()
        sa = ib_socket(pair.a, A, 4000)
        ib_socket(pair.b, B, 5000)
        pair.a.sendmsg(sa, b"x", [], 0, (ip(B), 5000), True)
        assert not svc._peers_connected()  # queued and dialling: not yet
        pair.loop.run()
        assert svc._peers_connected()
        pair.ib_a.reset()
        assert not svc._peers_connected()
    finally:
        pair.ib_a.close()
        pair.ib_b.close()
        svc.close()


# -- IPv6 ----------------------------------------------------------------------------------------------------
A6 = "fd00:98::1"
B6 = "fd00:98::2"


def pair6(**kw: object) -> Pair:
    pair = Pair(**kw)  # type: ignore[arg-type]
    pair.fabric.devices.update({A6: "rxe0", B6: "rxe0"})
    return pair


def ib_socket6(stack: Stack, addr: str, port: int) -> SockState:
    rs = stack.open()
    setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
    stack.bind(rs, ipaddress.IPv6Address(addr), port, 0)
    return rs


def test_ipv6_over_ib_port_16385_and_the_56_byte_private_data() -> None:
    """rds_rdma_listen_init: IPv6 listens on RDS_CM_PORT (16385) and parses rds6_ib_connect_private (56
    bytes); rds_ib_conn_path_connect dials c_faddr:16385 for an IPv6 connection."""
    pair = pair6()
    sa = ib_socket6(pair.a, A6, 4000)
    sb = ib_socket6(pair.b, B6, 5000)
    a6, b6 = ipaddress.IPv6Address(A6), ipaddress.IPv6Address(B6)
    assert pair.ib_a.nodes[a6].port == RDS_CM_PORT and pair.ib_b.nodes[b6].port == RDS_CM_PORT
    assert (B6, RDS_CM_PORT) in pair.fabric.listeners and (B6, RDS_IB_PORT) not in pair.fabric.listeners
    sizes = [0, 1, 4097, 65536]
    for i, n in enumerate(sizes):
        assert pair.a.sendmsg(sa, payload(n, i), [], 0, (b6, 5000), True) == n
    pair.loop.run()
    assert recv_all(pair.b, sb) == [(payload(n, i), (A6, 4000)) for i, n in enumerate(sizes)]
    pair.b.sendmsg(sb, b"back", [], 0, (a6, 4000), True)
    pair.loop.run()
    assert recv_all(pair.a, sa) == [(b"back", (B6, 5000))]
    conn = pair.ib_a.nodes[a6].conns[b6]
    assert conn.cmid is not None
    dialled = conn.cmid
    assert (dialled.dst, dialled.port) == (B6, RDS_CM_PORT)  # type: ignore[attr-defined]
    private = dialled.sent_private  # type: ignore[attr-defined]
    assert len(private) == 56
    assert private[:16] == a6.packed and private[16:32] == b6.packed  # dp_saddr = mine, dp_daddr = yours
    assert sa.snd_bytes == 0 and not pair.ib_a.pending[(a6, b6)]
    # the info tables: the v6 tables list the IPv6 connection, the v4 ones leave it out (ib.c visitors)
    rows6 = info_tables.records(pair.a, InfoType.RDS6_INFO_IB_CONNECTIONS)
    assert [(r.src_addr, r.dst_addr) for r in rows6] == [(a6, b6)]
    assert rows6[0].src_gid == a6.packed and rows6[0].dst_gid == b6.packed
    assert info_tables.records(pair.a, InfoType.RDS_INFO_IB_CONNECTIONS) == []
    conns6 = info_tables.records(pair.a, InfoType.RDS6_INFO_CONNECTIONS)
    assert [(r.laddr, r.faddr, r.transport) for r in conns6] == [(a6, b6, "infiniband")]
    assert info_tables.records(pair.a, InfoType.RDS_INFO_CONNECTIONS) == []


def test_ipv4_and_ipv6_nodes_side_by_side() -> None:
    pair = pair6()
    sa4, sb4 = ib_socket(pair.a, A, 4000), ib_socket(pair.b, B, 5000)
    sa6, sb6 = ib_socket6(pair.a, A6, 4000), ib_socket6(pair.b, B6, 5000)
    pair.a.sendmsg(sa4, b"four", [], 0, (ip(B), 5000), True)
    pair.a.sendmsg(sa6, b"six", [], 0, (ipaddress.IPv6Address(B6), 5000), True)
    pair.loop.run()
    assert recv_all(pair.b, sb4) == [(b"four", (A, 4000))]
    assert recv_all(pair.b, sb6) == [(b"six", (A6, 4000))]
    assert {(la, p) for la, p in pair.fabric.listeners} >= {(B, RDS_IB_PORT), (B6, RDS_CM_PORT)}


def test_ipv6_request_on_the_v6_listener_is_parsed_as_56_bytes() -> None:
    """The v6 listener parses the REQ as rds6_ib_connect_private: one naming another IPv6 address as dp_daddr
    is rejected as not ours (rds_ib_cm_handle_connect builds the connection from these fields)."""
    from pyrds.userspace.transports.ib.privdata import ConnectPrivate

    pair = pair6()
    ib_socket6(pair.b, B6, 5000)
    node_b = pair.ib_b.nodes[ipaddress.IPv6Address(B6)]
    ch = pair.fabric.verbs().create_channel()
    cm = ch.create_id()
    cm.resolve_addr(A6, B6, RDS_CM_PORT, 5000)
    cm.create_qp(QpConfig(8, 8))
    cm.qp.to_init()  # type: ignore[union-attr]
    wrong = ConnectPrivate(
        ipaddress.IPv6Address(A6), ipaddress.IPv6Address("fd00:98::9"), 3, 1, 3, 0, 0, 0
    ).pack()
    cm.connect(ConnParams(wrong))
    pair.loop.run()
    assert node_b.counters["ib_request_not_ours"] == 1 and node_b.counters["ib_rejected"] == 1
    assert node_b.conns == {} and node_b.engines == {}
    kinds = []
    while (ev := ch.get_event()) is not None:
        kinds.append(ev.kind)
    assert CmEventKind.REJECTED in kinds  # the REJ reached the dialler


def test_ipv6_link_local_fails_the_ib_address_check() -> None:
    """Divergence (docs/userspace.md): the kernel binds an IPv6 link-local address with the socket's scope id;
    here the IB address check refuses it: a pinned socket's bind is ENOPROTOOPT (rds_bind)."""
    pair = pair6()
    pair.fabric.devices["fe80::1"] = "rxe0"
    rs = pair.a.open()
    setsockopt(pair.a, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
    with pytest.raises(StackError) as ei:
        pair.a.bind(rs, ipaddress.IPv6Address("fe80::1"), 4000, 3)
    assert ei.value.code == errno.ENOPROTOOPT
    assert "fe80::1" not in pair.fabric.addr_checks


def test_kernel_holding_16385_leaves_an_ipv6_node_active_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pyrds.userspace.ib")
    pair = pair6(listen_errno=errno.EADDRNOTAVAIL)
    pair.fabric.verbs().create_channel().create_id().listen(A6, RDS_CM_PORT, 128)
    sa = ib_socket6(pair.a, A6, 4000)
    assert pair.ib_a.nodes[ipaddress.IPv6Address(A6)].listener is None
    assert any("16385" in r.getMessage() and "active only" in r.getMessage() for r in caplog.records)
    sb = ib_socket6(pair.b, B6, 5000)
    pair.a.sendmsg(sa, b"hello", [], 0, (ipaddress.IPv6Address(B6), 5000), True)
    pair.loop.run()
    assert recv_all(pair.b, sb) == [(b"hello", (A6, 4000))]


# -- receive cap ---------------------------------------------------------------------------------------------
#: charged bytes (payload + RECV_MSG_OVERHEAD each) a socket queues before it is over its cap
HOLD_CAP = 20_000


def test_a_receiver_over_its_cap_holds_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """B's socket never reads: once it is over its cap, B's end of the connection reposts no receive buffer,
    so A's sends stall in RNR retries (the fake fabric keeps them on the wire) instead of queueing in B's
    stack; reading the queue down releases the hold and every message arrives, in order, exactly once."""
    monkeypatch.setattr(core, "recv_cap", lambda rcvbuf: HOLD_CAP)
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    sb = ib_socket(pair.b, B, 5000)
    count, size = 100, 1000
    for i in range(count):
        pair.a.sendmsg(sa, payload(size, i), [], 0, (ip(B), 5000), True)
    pair.loop.run()
    conn = pair.ib_b.nodes[ip(B)].conns[ip(A)]
    held = len(sb.recv_queue)
    # over the cap after HOLD_CAP / (size + 256) messages; at most the ring's buffers posted before more
    first_over = HOLD_CAP // (size + RECV_MSG_OVERHEAD)
    assert first_over <= held <= first_over + 1 + SMALL["recv_wr"]
    assert conn.rx_holds == {(ip(B), 5000)}
    assert pair.b.counters["recv_cap_hold"] == 1  # one hold, however many frames arrived over the cap
    assert conn.counters["ib_recv_hold"] == 1
    got: list[bytes] = []
    for _ in range(count):
        got += [d for d, _ in recv_all(pair.b, sb)]
        pair.loop.run()
        if len(got) == count:
            break
    assert got == [payload(size, i) for i in range(count)]
    assert not conn.rx_holds and conn.counters["ib_recv_hold_released"] >= 1
    assert conn.state.value == "up"


def test_closing_a_held_receiver_releases_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hold ends when the socket over its cap closes; messages to another socket on that connection then
    flow again."""
    monkeypatch.setattr(core, "recv_cap", lambda rcvbuf: HOLD_CAP)
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    sb = ib_socket(pair.b, B, 5000)
    sb2 = ib_socket(pair.b, B, 5001)
    for i in range(60):
        pair.a.sendmsg(sa, payload(1000, i), [], 0, (ip(B), 5000), True)
    pair.loop.run()
    conn = pair.ib_b.nodes[ip(B)].conns[ip(A)]
    assert conn.rx_holds
    pair.a.sendmsg(sa, b"to the other socket", [], 0, (ip(B), 5001), True)
    pair.loop.run()
    assert recv_all(pair.b, sb2) == []  # behind the held ring
    pair.b.close(sb)
    pair.loop.run()
    assert not conn.rx_holds
    assert recv_all(pair.b, sb2) == [(b"to the other socket", (A, 4000))]
