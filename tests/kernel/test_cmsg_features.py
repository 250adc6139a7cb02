"""Receive-side control messages and zerocopy: SO_TIMESTAMP, RXPATH_LATENCY, ZCOPY cookies on TCP."""

from __future__ import annotations

import errno
import select
import socket
import time
from typing import Any

from kernel_helpers import errno_of, loop_pair, recv_full, tcp_pair

from pyrds import cmsg
from pyrds.constants import SOL_RDS, SockOpt

MSG_ZEROCOPY = 0x4000000
SO_ZEROCOPY = 60


def test_so_timestamp_loop(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, port=4700)
    b.setsockopt(socket.SOL_SOCKET, cmsg.SO_TIMESTAMP_OLD, 1)
    t0 = time.time()
    a.sendto(b"ts", b.getsockname())
    data, anc, _fl, _addr = recv_full(b)
    assert data == b"ts"
    ts = [x for x in cmsg.parse_ancdata(anc) if isinstance(x, cmsg.Timestamp)]
    assert len(ts) == 1
    assert t0 - 1 <= ts[0].time <= time.time() + 1


def test_so_timestamp_tcp(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    a, b = tcp_pair(tcp_net, sockets, port=4710)
    b.setsockopt(socket.SOL_SOCKET, cmsg.SO_TIMESTAMP_OLD, 1)
    a.sendto(b"ts", b.getsockname())
    _data, anc, _fl, _addr = recv_full(b)
    assert [type(x) for x in cmsg.parse_ancdata(anc)] == [cmsg.Timestamp]


def test_no_timestamp_without_option(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, port=4720)
    a.sendto(b"x", b.getsockname())
    assert recv_full(b)[1] == []


def test_rxpath_latency_tcp(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    a, b = tcp_pair(tcp_net, sockets, port=4730)
    b.setsockopt(SOL_RDS, SockOpt.SO_RDS_MSG_RXPATH_LATENCY, cmsg.rx_trace_so([0, 1, 2]))
    a.sendto(b"lat", b.getsockname())
    data, anc, _fl, _addr = recv_full(b)
    assert data == b"lat"
    tr = [x for x in cmsg.parse_ancdata(anc) if isinstance(x, cmsg.RxTrace)]
    assert len(tr) == 1
    assert tr[0].positions == (0, 1, 2)
    assert len(tr[0].values) == 3


def test_rxpath_latency_bad_values(sockets: list[Any]) -> None:
    a, _b = loop_pair(sockets, port=4740)
    opt = SockOpt.SO_RDS_MSG_RXPATH_LATENCY
    # position 3 (== RDS_MSG_RX_DGRAM_TRACE_MAX) and a wrong option length are refused
    assert errno_of(lambda: a.setsockopt(SOL_RDS, opt, bytes([1, 3, 0, 0]))) == errno.EFAULT
    assert errno_of(lambda: a.setsockopt(SOL_RDS, opt, bytes([4, 0, 0, 0]))) == errno.EFAULT
    assert errno_of(lambda: a.setsockopt(SOL_RDS, opt, bytes([1, 0]))) == errno.EFAULT


def _reap_zcookies(sock: Any, want: int, timeout: float = 10.0) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        select.select([sock.fileno()], [], [], 0.5)
        try:
            data, anc, _fl, _addr = sock.recvmsg(0, 256, 0x40)
        except BlockingIOError:
            continue
        assert data == b""
        for x in cmsg.parse_ancdata(anc):
            assert isinstance(x, cmsg.ZcopyCompletion)
            got.extend(x.cookies)
    return got


def test_zerocopy_cookies_tcp(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    """MSG_ZEROCOPY + RDS_CMSG_ZCOPY_COOKIE on TCP: the sender later reads RDS_CMSG_ZCOPY_COMPLETION.
    6.1: completions are reaped only by a non-blocking recvmsg with an empty receive queue."""
    a, b = tcp_pair(tcp_net, sockets, port=4750)
    a.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    dst = b.getsockname()
    payload = b"z" * 5000  # zerocopy: the kernel reads these pages after sendmsg returns
    for cookie in (11, 12, 13):
        assert a.sendmsg([payload], [cmsg.zcopy_cookie(cookie)], MSG_ZEROCOPY, dst) == 5000
    for _ in range(3):
        assert recv_full(b)[0] == b"z" * 5000
    assert sorted(_reap_zcookies(a, 3)) == [11, 12, 13]


def test_zerocopy_errnos(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    a, b = tcp_pair(tcp_net, sockets, port=4760)
    dst = b.getsockname()
    a.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    # MSG_ZEROCOPY without a cookie
    assert errno_of(lambda: a.sendmsg([b"z"], [], MSG_ZEROCOPY, dst)) == errno.EINVAL
    l1, l2 = loop_pair(sockets, port=4770)
    l1.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    err = errno_of(lambda: l1.sendmsg([b"z"], [cmsg.zcopy_cookie(1)], MSG_ZEROCOPY, l2.getsockname()))
    assert err == errno.EOPNOTSUPP
