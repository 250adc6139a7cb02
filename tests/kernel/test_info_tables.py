"""Every RDS_INFO table read from the real kernel through pyrds.kernel, with plausible content."""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
from typing import Any

import pytest
from kernel_helpers import errno_of, loop_pair, make_socket, recv_full, tcp_pair

from pyrds import info
from pyrds.constants import SOL_RDS, InfoConnectionFlag, InfoType
from pyrds.kernel import libc
from pyrds.kernel.info import read_counters, read_info, read_info_raw


def test_counters() -> None:
    c = read_counters()
    assert len(c) > 20
    for name in ("conn_reset", "recv_delivered", "send_queued", "cong_update_received"):
        assert name in c
    assert all(v >= 0 for v in c.values())


def test_enospc_protocol(sockets: list[Any]) -> None:
    """len 0 probes: ENOSPC, optlen = bytes needed; success returns the record size, optlen the total."""
    s = make_socket()
    sockets.append(s)
    fd = s.fileno()
    ret, err, optlen = libc.getsockopt_raw(fd, SOL_RDS, InfoType.RDS_INFO_COUNTERS, None, 0)
    assert (ret, err) == (-1, errno.ENOSPC)
    assert optlen > 0 and optlen % 40 == 0
    small = ctypes.create_string_buffer(40)
    ret, err, needed = libc.getsockopt_raw(fd, SOL_RDS, InfoType.RDS_INFO_COUNTERS, small, 40)
    assert (ret, err, needed) == (-1, errno.ENOSPC, optlen)
    buf = ctypes.create_string_buffer(optlen + 100)
    ret, err, got = libc.getsockopt_raw(fd, SOL_RDS, InfoType.RDS_INFO_COUNTERS, buf, optlen + 100)
    assert (ret, err, got) == (40, 0, optlen)


def test_empty_table_probe(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    ret, err, optlen = libc.getsockopt_raw(s.fileno(), SOL_RDS, InfoType.RDS_INFO_RETRANS_MESSAGES, None, 0)
    # nothing in flight: the probe succeeds with the record size and 0 bytes
    assert (ret, err, optlen) == (26, 0, 0)


@pytest.mark.parametrize("bad", [10002, 9999, 10018])
def test_unknown_info_type(bad: int, sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    assert errno_of(lambda: s.get_info_raw(bad)) == errno.ENOPROTOOPT


def test_unregistered_tables() -> None:
    """6.1 registers no handler for CONNECTION_STATS and IWARP_CONNECTIONS: ENOPROTOOPT."""
    for t in (InfoType.RDS_INFO_CONNECTION_STATS, InfoType.RDS_INFO_IWARP_CONNECTIONS):
        assert errno_of(lambda t=t: read_info_raw(t)) == errno.ENOPROTOOPT


def test_sockets_tables(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, port=4500)
    v6a, _v6b = loop_pair(sockets, host="::1", port=4510)
    a.connect(b.getsockname())
    recs = [r for r in read_info(InfoType.RDS_INFO_SOCKETS) if r.bound_port in (4500, 4501)]
    by_port = {r.bound_port: r for r in recs}
    assert set(by_port) == {4500, 4501}
    ra = by_port[4500]
    assert ra.bound_addr == ipaddress.IPv4Address("127.0.0.1")
    assert ra.connected_addr == ipaddress.IPv4Address("127.0.0.1") and ra.connected_port == 4501
    assert ra.inum == os.fstat(a.fileno()).st_ino
    assert ra.sndbuf > 0 and ra.rcvbuf > 0
    recs6 = [r for r in read_info(InfoType.RDS6_INFO_SOCKETS) if r.bound_port == 4510]
    assert len(recs6) == 1
    assert recs6[0].bound_addr == ipaddress.IPv6Address("::1")
    assert recs6[0].inum == os.fstat(v6a.fileno()).st_ino
    # the v6 table also lists v4 sockets (as v4-mapped addresses)
    mapped = [r for r in read_info(InfoType.RDS6_INFO_SOCKETS) if r.bound_port == 4500]
    assert mapped and mapped[0].bound_addr == ipaddress.IPv6Address("::ffff:127.0.0.1")


def test_recv_messages_and_loop_connection(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, port=4520)
    a.sendto(b"queued!", b.getsockname())
    import time

    time.sleep(0.2)
    msgs = [m for m in read_info(InfoType.RDS_INFO_RECV_MESSAGES) if m.lport == 4521]
    assert len(msgs) == 1
    m = msgs[0]
    assert m.len == 7 and m.fport == 4520 and m.laddr == ipaddress.IPv4Address("127.0.0.1")
    conns = [
        c
        for c in read_info(InfoType.RDS_INFO_CONNECTIONS)
        if c.laddr == c.faddr == ipaddress.IPv4Address("127.0.0.1")
    ]
    # 6.1 names the loop transport "loopback" in rds_info_connection.transport
    assert conns and conns[0].transport == "loopback"
    assert recv_full(b)[0] == b"queued!"
    assert not [m for m in read_info(InfoType.RDS_INFO_RECV_MESSAGES) if m.lport == 4521]


def test_tcp_tables(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    a, b = tcp_pair(tcp_net, sockets, port=4530)
    a.sendto(b"x", b.getsockname())
    assert recv_full(b)[0] == b"x"
    a4, b4 = ipaddress.IPv4Address(tcp_net["a4"]), ipaddress.IPv4Address(tcp_net["b4"])
    conns = [c for c in read_info(InfoType.RDS_INFO_CONNECTIONS) if c.faddr == b4]
    assert conns, "no RDS/TCP connection listed"
    c = conns[0]
    assert c.laddr == a4 and c.transport == "tcp"
    assert c.flags & InfoConnectionFlag.CONNECTED
    assert c.next_tx_seq >= 2
    tcp = [t for t in read_info(InfoType.RDS_INFO_TCP_SOCKETS) if t.peer_addr == b4]
    assert tcp and tcp[0].local_addr == a4
    assert 16385 in (tcp[0].local_port, tcp[0].peer_port)
    # 6.1: an idle receiver waits for a whole header: hdr_rem is 48 (sizeof(struct rds_header)), not 0
    assert tcp[0].hdr_rem in (0, 48) and tcp[0].data_rem == 0


def test_tcp6_tables(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    a, b = tcp_pair(tcp_net, sockets, v6=True, port=4540)
    a.sendto(b"y", b.getsockname())
    assert recv_full(b)[0] == b"y"
    b6 = ipaddress.IPv6Address(tcp_net["b6"])
    conns = [c for c in read_info(InfoType.RDS6_INFO_CONNECTIONS) if c.faddr == b6]
    assert conns and conns[0].transport == "tcp"
    tcp = [t for t in read_info(InfoType.RDS6_INFO_TCP_SOCKETS) if t.peer_addr == b6]
    assert tcp and 16385 in (tcp[0].local_port, tcp[0].peer_port)
    # v6 connections are not in the v4 table
    assert not [c for c in read_info(InfoType.RDS_INFO_CONNECTIONS) if str(c.faddr) == tcp_net["b6"]]


@pytest.mark.parametrize("info_type", [t for t in InfoType if t not in (10009, 10010)])
def test_every_table_parses(info_type: InfoType) -> None:
    each, raw = read_info_raw(info_type)
    assert each == info.record_size(info_type)
    assert len(raw) % each == 0
    recs = info.parse_info(info_type, raw)
    assert info.encode_info(info_type, recs) == raw
