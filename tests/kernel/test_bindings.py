"""Kernel backend bindings on the real AF_RDS: addressing (v4 and v6), options, TOS ioctls, errno."""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import pytest
from kernel_helpers import errno_of, loop_pair, make_socket, recv_full, tcp_pair

from pyrds import uapi
from pyrds.constants import AF_RDS, SOL_RDS, SockOpt, Transport
from pyrds.kernel import RDSSocket, libc


def test_socket_is_real_af_rds(sockets: list[Any]) -> None:
    s = RDSSocket()
    sockets.append(s)
    assert s.backend == "kernel"
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == AF_RDS
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_SEQPACKET


def test_wrong_socket_type_is_esocktnosupport() -> None:
    with pytest.raises(OSError) as ei:
        libc.socket(AF_RDS, socket.SOCK_DGRAM, 0)
    assert ei.value.errno == errno.ESOCKTNOSUPPORT


def test_unbound_getsockname_is_unspec(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    assert s.getsockname() == ("0.0.0.0", 0)
    assert errno_of(s.getpeername) == errno.ENOTCONN


def test_transport_option(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == -1
    s.bind(("127.0.0.1", 0))
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.LOOP
    host, port = s.getsockname()[:2]
    assert host == "127.0.0.1" and port >= 2
    assert errno_of(lambda: s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 2)) == errno.EOPNOTSUPP


def test_transport_option_bad_values(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    assert errno_of(lambda: s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, -1)) == errno.EINVAL
    assert errno_of(lambda: s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 3)) == errno.EINVAL
    s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 2)
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == 2
    assert errno_of(lambda: s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 2)) == errno.EOPNOTSUPP


def test_loop_v4_send_recv(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets)
    assert a.sendto(b"hello", b.getsockname()) == 5
    data, anc, flags, addr = recv_full(b)
    assert (data, anc, flags, addr) == (b"hello", [], 0, a.getsockname())


def test_ipv6_loopback_sockaddr_in6(sockets: list[Any]) -> None:
    """IPv6 RDS needs sockaddr_in6, which the stdlib cannot pass for AF_RDS: prove the ctypes path."""
    a, b = loop_pair(sockets, host="::1", port=4210)
    assert a.getsockname() == ("::1", 4210, 0, 0)
    a.sendmsg([b"v6", b"-", b"iov"], (), 0, ("::1", 4211))
    data, _anc, _flags, addr = recv_full(b)
    assert data == b"v6-iov"
    assert addr == ("::1", 4210, 0, 0)


def test_ipv6_over_tcp(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    a, b = tcp_pair(tcp_net, sockets, v6=True, port=4400)
    assert a.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.TCP
    a.connect(b.getsockname())
    assert a.getpeername() == (tcp_net["b6"], 4401, 0, 0)
    for i in range(20):
        a.send(b"msg%d" % i)
    got = [recv_full(b)[0] for _ in range(20)]
    assert got == [b"msg%d" % i for i in range(20)]
    b.sendto(b"back", a.getsockname())
    data, _anc, _fl, addr = recv_full(a)
    assert data == b"back" and addr == (tcp_net["b6"], 4401, 0, 0)


def test_ipv4_over_tcp(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    a, b = tcp_pair(tcp_net, sockets, port=4410)
    payload = os.urandom(60000)
    a.sendto(payload, b.getsockname())
    data, _anc, _fl, addr = recv_full(b)
    assert data == payload and addr == (tcp_net["a4"], 4410)


def test_getsockopt_large_buffer_and_stdlib_limit(sockets: list[Any]) -> None:
    """getsockopt with > 1024 bytes (the stdlib caps buflen at 1024)."""
    s = make_socket()
    sockets.append(s)
    raw = s.getsockopt(SOL_RDS, 10000, 64 * 1024)
    assert isinstance(raw, bytes) and len(raw) > 1024 and len(raw) % 40 == 0
    std = socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    with std, pytest.raises(OSError):
        std.getsockopt(SOL_RDS, 10000, 4096)


def test_tos_unbound_is_enotty(sockets: list[Any]) -> None:
    """6.1: SIOCRDSSETTOS without a transport returns -ENOIOCTLCMD, seen by userspace as ENOTTY."""
    s = make_socket()
    sockets.append(s)
    assert s.get_tos() == 0
    assert errno_of(lambda: s.set_tos(1)) == errno.ENOTTY


def test_tos_on_tcp(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    """6.1 differs from rds-facts: rds_tcp_get_tos_map() maps every TOS to 0, so SIOCRDSSETTOS succeeds on a
    TCP socket, SIOCRDSGETTOS then reads 0 and the TOS can be set again; once the socket has a cached
    connection (after a send) SETTOS fails with EINVAL."""
    a, b = tcp_pair(tcp_net, sockets, port=4420)
    a.set_tos(3)
    assert a.get_tos() == 0
    a.set_tos(4)
    assert a.get_tos() == 0
    a.sendto(b"tos", b.getsockname())
    assert recv_full(b)[0] == b"tos"
    assert errno_of(lambda: a.set_tos(5)) == errno.EINVAL


def test_tos_on_loop(sockets: list[Any]) -> None:
    a, _b = loop_pair(sockets, port=4220)
    err = errno_of(lambda: a.set_tos(2))
    assert err in (None, errno.ENOTTY)
    if err is None:
        assert a.get_tos() == 2


def test_bind_errnos(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    assert errno_of(lambda: s.bind(("0.0.0.0", 4000))) == errno.EINVAL
    assert errno_of(lambda: s.bind(("255.255.255.255", 4000))) == errno.EINVAL
    assert errno_of(lambda: s.bind(("224.0.0.1", 4000))) == errno.EINVAL
    assert errno_of(lambda: s.bind(("127.0.0.1", 1))) == errno.EINVAL
    assert errno_of(lambda: s.bind(("192.0.2.99", 4000))) == errno.EADDRNOTAVAIL
    s.bind(("127.0.0.1", 4230))
    assert errno_of(lambda: s.bind(("127.0.0.1", 4231))) == errno.EINVAL
    t = make_socket()
    sockets.append(t)
    assert errno_of(lambda: t.bind(("127.0.0.1", 4230))) == errno.EADDRINUSE


def test_bind_preset_transport_refuses_address(sockets: list[Any]) -> None:
    s = make_socket(Transport.IB)
    sockets.append(s)
    err = errno_of(lambda: s.bind(("127.0.0.1", 4240)))
    assert err in (errno.ENOPROTOOPT, errno.EADDRNOTAVAIL)


def test_send_errnos(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, port=4250)
    dst = b.getsockname()
    assert errno_of(lambda: a.send(b"x")) == errno.ENOTCONN
    assert errno_of(lambda: a.sendto(b"x", socket.MSG_NOSIGNAL, dst)) == errno.EOPNOTSUPP
    assert errno_of(lambda: a.sendto(b"x" * ((1 << 20) + 1), dst)) == errno.EMSGSIZE
    u = make_socket()
    sockets.append(u)
    assert errno_of(lambda: u.sendto(b"x", dst)) == errno.ENOTCONN
    assert errno_of(lambda: u.connect(("0.0.0.0", 5))) == errno.EDESTADDRREQ


def test_rdma_cmsg_on_tcp_is_eopnotsupp(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    from pyrds import cmsg

    a, b = tcp_pair(tcp_net, sockets, port=4430)
    mr = cmsg.rdma_args(uapi.rdma_cookie(1, 0), 0, 8, 0, 0)
    err = errno_of(lambda: a.sendmsg([b"x"], [mr], 0, b.getsockname()))
    assert err in (errno.EOPNOTSUPP, errno.EINVAL)


def test_timeout_raises_timeouterror(sockets: list[Any]) -> None:
    a, _b = loop_pair(sockets, port=4260)
    a.settimeout(0.2)
    with pytest.raises(TimeoutError) as ei:
        a.recvmsg(100)
    assert ei.value.errno is None
    a.setblocking(False)
    with pytest.raises(BlockingIOError):
        a.recv(100)


def test_options_are_real(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 131072
    s.setsockopt(SOL_RDS, SockOpt.RDS_RECVERR, 1)
    assert s.getsockopt(SOL_RDS, SockOpt.RDS_RECVERR) == 1
    s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    # 6.1: rds_getsockopt() knows only RDS_INFO_*, RDS_RECVERR and SO_RDS_TRANSPORT
    assert errno_of(lambda: s.getsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR)) == errno.ENOPROTOOPT


def test_cancel_sent_to_errnos(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    addr = uapi.to_bytes(uapi.make_sockaddr_in("127.0.0.1", 5))
    assert errno_of(lambda: s.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, addr)) == errno.ENOTCONN
    s.bind(("127.0.0.1", 0))
    assert errno_of(lambda: s.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, addr[:8])) == errno.EINVAL
    s.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, addr)


def test_unsupported_calls(sockets: list[Any]) -> None:
    s = make_socket()
    sockets.append(s)
    std = socket.socket(fileno=os.dup(s.fileno()))
    with std:
        for fn in (lambda: std.listen(1), lambda: std.shutdown(socket.SHUT_RDWR)):
            assert errno_of(fn) == errno.EOPNOTSUPP
