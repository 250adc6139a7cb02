"""What the userspace stack shows of RDS/IB, as a kernel with rds_rdma does: RDS_INFO_IB_CONNECTIONS and
RDS6_INFO_IB_CONNECTIONS (ib.c ``rds_ib_ic_info`` / ``rds6_ib_ic_info``, uapi ``rds_info_rdma_connection``),
the ``rds_ib_stat_names`` rows of RDS_INFO_COUNTERS (ib_stats.c), and the transport an unpinned socket gets
at bind (transport.c ``rds_trans_get_preferred``: IB before TCP). Two stacks on the fake verbs fabric."""

from __future__ import annotations

import errno
import ipaddress
import struct

import pytest
from ib_fakeverbs import roce_gid
from test_ib_transport import NODEV, SMALL, A, B, Pair, ib_socket, ip, payload, recv_all

from pyrds import info
from pyrds.constants import SOL_RDS, InfoType, SockOpt
from pyrds.constants import Transport as TransportType
from pyrds.userspace.config import StackConfig
from pyrds.userspace.stack import info_tables
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.counters import IB_NAMES, INFO_NAMES, KERNEL_NAMES, TCP_NAMES
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.sockopts import getsockopt
from pyrds.userspace.transports import loop_transport

IB_TABLES = (InfoType.RDS_INFO_IB_CONNECTIONS, InfoType.RDS6_INFO_IB_CONNECTIONS)


def exchange(pair: Pair, n: int = 3) -> None:
    sa = ib_socket(pair.a, A, 4000)
    sb = ib_socket(pair.b, B, 5000)
    for i in range(n):
        pair.a.sendmsg(sa, payload(5000, i), [], 0, (ip(B), 5000), True)
    pair.loop.run()
    assert len(recv_all(pair.b, sb)) == n
    for i in range(n):
        pair.b.sendmsg(sb, payload(10, i), [], 0, (ip(A), 4000), True)
    pair.loop.run()
    assert len(recv_all(pair.a, sa)) == n


def counters(stack: Stack) -> list[tuple[str, int]]:
    return [(r.name, r.value) for r in info_tables.records(stack, InfoType.RDS_INFO_COUNTERS)]


# -- without RDS/IB: as a kernel without rds_rdma ---------------------------------------------------------
def test_without_ib_the_ib_tables_have_no_handler_and_counters_no_ib_rows() -> None:
    stack = Stack(StackConfig(initial_netns=True))
    stack.attach(loop_transport(stack))
    rs = stack.open()
    for t in IB_TABLES:
        with pytest.raises(StackError) as ei:
            getsockopt(stack, rs, SOL_RDS, t, 0)
        assert ei.value.code == errno.ENOPROTOOPT
    assert [name for name, _ in counters(stack)] == list(INFO_NAMES)


def test_tables_answered_with_ib_are_the_kernels_with_rds_rdma() -> None:
    """The RDS_INFO types a kernel with rds, rds_tcp and rds_rdma answers: all of 10000..10017 but FLOWS
    (10002, gone), CONNECTION_STATS (10009) and IWARP_CONNECTIONS (10010), which have no handler."""
    pair = Pair()
    rs = pair.a.open()
    answered = set()
    for t in range(10000, 10018):
        try:
            getsockopt(pair.a, rs, SOL_RDS, t, 1 << 20)
        except StackError as exc:
            assert exc.code == errno.ENOPROTOOPT, (t, exc.code)
        else:
            answered.add(t)
    assert set(range(10000, 10018)) - answered == {10002, 10009, 10010}


# -- RDS_INFO_IB_CONNECTIONS ---------------------------------------------------------------------------------
def test_ib_connections_table_rows_and_layout() -> None:
    pair = Pair()
    assert info_tables.records(pair.a, InfoType.RDS_INFO_IB_CONNECTIONS) == []
    exchange(pair)
    rows = info_tables.records(pair.a, InfoType.RDS_INFO_IB_CONNECTIONS)
    want = info.RdmaConnectionInfo(
        ip(A), ip(B), roce_gid(A), roce_gid(B), SMALL["send_wr"], SMALL["recv_wr"], 8, 0, 0, 0, 0, 0
    )
    assert rows == [want]
    rows_b = info_tables.records(pair.b, InfoType.RDS_INFO_IB_CONNECTIONS)
    assert [(r.src_addr, r.dst_addr, r.src_gid, r.dst_gid) for r in rows_b] == [
        (ip(B), ip(A), roce_gid(B), roce_gid(A))
    ]
    # the bytes a getsockopt returns: one 68-byte rds_info_rdma_connection (not packed), kernel offsets
    rs = pair.a.open()
    with pytest.raises(StackError) as ei:
        getsockopt(pair.a, rs, SOL_RDS, InfoType.RDS_INFO_IB_CONNECTIONS, 0)
    assert ei.value.code == errno.ENOSPC and ei.value.args[1] == 68
    raw = getsockopt(pair.a, rs, SOL_RDS, InfoType.RDS_INFO_IB_CONNECTIONS, 68)
    assert isinstance(raw, bytes) and len(raw) == 68
    assert raw[0:4] == ip(A).packed and raw[4:8] == ip(B).packed
    assert raw[8:24] == roce_gid(A) and raw[24:40] == roce_gid(B)
    assert struct.unpack_from("=5I", raw, 40) == (SMALL["send_wr"], SMALL["recv_wr"], 8, 0, 0)
    assert raw[60:62] == b"\0\0" and struct.unpack_from("=I", raw, 64) == (0,)
    # RDS6: every connection, IPv4 ones v4-mapped, 92 bytes each
    rows6 = info_tables.records(pair.a, InfoType.RDS6_INFO_IB_CONNECTIONS)
    mapped = ipaddress.IPv6Address(f"::ffff:{A}"), ipaddress.IPv6Address(f"::ffff:{B}")
    assert [(r.src_addr, r.dst_addr, r.src_gid, r.max_recv_wr) for r in rows6] == [
        (*mapped, roce_gid(A), SMALL["recv_wr"])
    ]
    raw6 = getsockopt(pair.a, rs, SOL_RDS, InfoType.RDS6_INFO_IB_CONNECTIONS, 1 << 10)
    assert isinstance(raw6, bytes) and len(raw6) == 92 and raw6[0:16] == mapped[0].packed


def test_a_connection_that_is_down_keeps_its_row_without_path_figures() -> None:
    """ib.c: GIDs, ring sizes and max_sge are only filled while RDS_CONN_UP (zero here otherwise)."""
    pair = Pair()
    exchange(pair, 1)
    pair.ib_a.reset()
    pair.fabric.unreachable.add(B)  # no redial comes up
    rows = info_tables.records(pair.a, InfoType.RDS_INFO_IB_CONNECTIONS)
    assert rows == [info.RdmaConnectionInfo(ip(A), ip(B), bytes(16), bytes(16), 0, 0, 0, 0, 0, 0, 0, 0)]


# -- RDS_INFO_COUNTERS ---------------------------------------------------------------------------------------
def test_counters_list_the_ib_names_between_core_and_tcp_and_count_the_driver() -> None:
    pair = Pair()
    exchange(pair, 3)
    rows = counters(pair.b)
    assert [name for name, _ in rows] == [*KERNEL_NAMES, *IB_NAMES, *TCP_NAMES]
    got = dict(rows)
    # B received three 5000-byte messages (two fragments each), and the congestion map (two fragments)
    assert got["ib_rx_cq_event"] >= 8
    # one connection: its receive ring was allocated (registered) once and filled once; no incoming structures
    assert got["ib_rx_total_frags"] == SMALL["recv_wr"] and got["ib_rx_refill_from_thread"] == 1
    assert got["ib_rx_total_incs"] == 0
    assert got["ib_tx_cq_event"] > 0 and got["ib_evt_handler_call"] > 0
    assert got["ib_evt_handler_call"] == got["ib_tasklet_call"]
    assert got["ib_rx_refill_from_cq"] > 0
    # the first message asked for an ACK at once: B acked it (an ACK frame or piggybacked on its replies)
    assert got["recv_ack_required"] >= 1 and got["ib_ack_sent"] + got["ib_ack_send_piggybacked"] >= 1
    assert dict(counters(pair.a))["send_ack_required"] >= 1  # counted by the IB engine, under the core name
    # no RDMA, no flow control, no MR pool: those stay 0
    for name in IB_NAMES:
        if name.startswith(("ib_rdma_", "ib_atomic_")) or "credit" in name or name == "ib_tx_throttle":
            assert got[name] == 0, name
    # the private getsockopt shows every counter, the userspace-only ones too
    stack_rows = {r.name: r.value for r in info_tables.records(pair.b, 10900)}
    assert stack_rows["ib_accepted"] == 1 and stack_rows["ib_rx_cq_event"] == got["ib_rx_cq_event"]
    assert stack_rows["ib_rx_messages"] >= 3 and stack_rows["ib_rx_frames"] >= 6


def test_counters_of_a_closed_connection_are_kept() -> None:
    pair = Pair()
    exchange(pair, 2)
    before = dict(counters(pair.a))
    pair.ib_a.reset()
    after = dict(counters(pair.a))
    for name in ("ib_rx_cq_event", "ib_tx_cq_event", "ib_evt_handler_call"):
        assert after[name] >= before[name] > 0, name


def test_ack_send_delayed_counts_an_ack_wanted_while_the_ack_wr_is_in_flight() -> None:
    from pyrds.userspace.transports.ib.engine import IbEngine

    eng = IbEngine(ip(A), ip(B), send_wr=8, recv_wr=16)
    eng.connect(0.0)
    eng.established(0.0)
    eng._ack_requested, eng._ack_in_flight = True, True
    wrs = eng.poll_send()
    assert not any(wr.kind.name == "ACK" for wr in wrs)
    assert eng.counters["ib_ack_send_delayed"] == 1


# -- transport of an unpinned socket -------------------------------------------------------------------------
def test_unpinned_socket_bound_to_an_rdma_address_gets_ib() -> None:
    pair = Pair()
    sa = pair.a.open()
    assert getsockopt(pair.a, sa, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 0) == -1
    pair.a.bind(sa, ip(A), 4000, 0)
    assert getsockopt(pair.a, sa, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 0) == int(TransportType.IB)
    sb = pair.b.open()
    pair.b.bind(sb, ip(B), 5000, 0)
    assert sb.transport == TransportType.IB
    pair.a.sendmsg(sa, b"unpinned", [], 0, (ip(B), 5000), True)
    pair.loop.run()
    assert recv_all(pair.b, sb) == [(b"unpinned", (A, 4000))]
    rows = info_tables.records(pair.a, InfoType.RDS_INFO_CONNECTIONS)
    assert [(r.faddr, r.transport) for r in rows] == [(ip(B), "infiniband")]


def test_unpinned_socket_elsewhere_keeps_loop_and_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    pair = Pair()
    monkeypatch.setattr(pair.a, "is_local", lambda _ip, _scope=0: True)
    lo = pair.a.open()
    pair.a.bind(lo, ip("127.0.0.1"), 4000, 0)
    assert lo.transport == TransportType.LOOP
    tcp = pair.a.open()
    pair.a.bind(tcp, ip(NODEV), 4000, 0)  # a local address without an RDMA device: laddr_check fails
    assert getsockopt(pair.a, tcp, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 0) == int(TransportType.TCP)
    v6 = pair.a.open()
    pair.a.bind(v6, ipaddress.IPv6Address("fd00::1"), 4000, 0)  # RDS/IB here is IPv4 only
    assert v6.transport == TransportType.TCP
    pinned = pair.a.open()
    from pyrds.userspace.stack.sockopts import setsockopt

    setsockopt(pair.a, pinned, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.TCP))
    pair.a.bind(pinned, ip(A), 4001, 0)  # pinned to TCP: TCP even on an RDMA address
    assert pinned.transport == TransportType.TCP


def test_unpinned_socket_without_ib_or_outside_the_initial_namespace_is_unchanged() -> None:
    stack = Stack(StackConfig(initial_netns=True))
    stack.attach(loop_transport(stack))
    rs = stack.open()
    with pytest.raises(StackError) as ei:
        stack.bind(rs, ip(A), 4000, 0)  # not local, no IB: EADDRNOTAVAIL, as before
    assert ei.value.code == errno.EADDRNOTAVAIL
    pair = Pair()
    other, _ = pair.stack(initial_netns=False)  # (the service never attaches IB there; rds_ib_laddr_check
    rs = other.open()  # says EPROTOTYPE, so rds_trans_get_preferred moves on to TCP)
    with pytest.raises(StackError) as ei:
        other.bind(rs, ip(A), 4000, 0)
    assert ei.value.code == errno.EADDRNOTAVAIL
