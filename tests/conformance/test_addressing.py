"""Addressing, bind and connect rules (af_rds.c rds_connect/rds_getname, bind.c rds_bind/rds_add_bound)."""

from __future__ import annotations

import errno
import socket

import pytest

from pyrds.testing.helpers import expect_errno

V4 = "127.0.0.1"
V6 = "::1"


@pytest.mark.parametrize("host", [V4, V6], ids=["ipv4", "ipv6"])
def test_loopback_roundtrip(rds_socket_factory, rds_observe, host):
    """Two sockets bound on the loopback address exchange a message; addresses come back in stdlib form."""
    a, b = rds_socket_factory(), rds_socket_factory()
    a.bind((host, 0))
    b.bind((host, 0))
    b.settimeout(5)
    pa, pb = a.getsockname(), b.getsockname()
    assert pa[0] == host and pa[1] >= 2
    assert len(pa) == (4 if ":" in host else 2)
    assert a.sendto(b"hello", pb) == 5
    data, src = b.recvfrom(100)
    assert data == b"hello"
    assert src[:2] == pa[:2]
    rds_observe("addr_len", (len(pa), len(src)))


def test_autobind_port_never_0_or_1(rds_socket_factory):
    """Port 0 autobinds to a port >= 2 (rds_add_bound starts at max(random, 2)); ports are unique."""
    ports = set()
    for _ in range(20):
        s = rds_socket_factory()
        s.bind((V4, 0))
        port = s.getsockname()[1]
        assert port >= 2
        ports.add(port)
    assert len(ports) == 20


@pytest.mark.parametrize(
    "addr,code",
    [
        (("0.0.0.0", 4000), errno.EINVAL),
        (("255.255.255.255", 4000), errno.EINVAL),
        (("224.0.0.1", 4000), errno.EINVAL),
        (("127.0.0.1", 1), errno.EINVAL),
        (("192.0.2.77", 4000), errno.EADDRNOTAVAIL),
        (("::", 4000, 0, 0), errno.EINVAL),
        (("ff02::1", 4000, 0, 0), errno.EINVAL),
    ],
    ids=["any", "broadcast", "multicast", "probe-port-1", "not-local", "any6", "mcast6"],
)
def test_bind_errors(rds_socket_factory, addr, code):
    s = rds_socket_factory()
    expect_errno(code, s.bind, addr)


def test_bind_twice_einval(rds_socket_factory):
    """RDS sockets cannot be re-bound: EINVAL even to the same address."""
    s = rds_socket_factory()
    s.bind((V4, 0))
    expect_errno(errno.EINVAL, s.bind, (V4, 0))
    expect_errno(errno.EINVAL, s.bind, s.getsockname())


def test_bind_in_use(rds_socket_factory):
    a, b = rds_socket_factory(), rds_socket_factory()
    a.bind((V4, 0))
    expect_errno(errno.EADDRINUSE, b.bind, a.getsockname())


def test_same_port_different_address_family(rds_socket_factory):
    """The bind hash keys on (address, port): the same port on 127.0.0.1 and ::1 can coexist."""
    a, b = rds_socket_factory(), rds_socket_factory()
    a.bind((V4, 0))
    port = a.getsockname()[1]
    b.bind((V6, port))
    assert b.getsockname()[1] == port


def test_connect_rules(rds_socket_factory):
    """connect() only records the default destination (no handshake); ANY -> EDESTADDRREQ; bcast/mcast ->
    EINVAL."""
    s = rds_socket_factory()
    expect_errno(errno.ENOTCONN, s.getpeername)
    expect_errno(errno.EDESTADDRREQ, s.connect, ("0.0.0.0", 4000))
    expect_errno(errno.EINVAL, s.connect, ("255.255.255.255", 4000))
    expect_errno(errno.EINVAL, s.connect, ("224.0.0.1", 4000))
    s.connect((V4, 4000))  # nobody there: fine, nothing is sent
    assert s.getpeername() == (V4, 4000)
    s.connect((V4, 4001))  # re-connect just replaces the default destination
    assert s.getpeername() == (V4, 4001)


def test_connect_then_send_default_destination(rds_pair):
    a, b = rds_pair
    a.connect(b.getsockname())
    assert a.send(b"via-connect") == 11
    data, src = b.recvfrom(100)
    assert data == b"via-connect" and src == a.getsockname()


def test_send_unbound_enotconn(rds_socket_factory, rds_pair):
    """sendmsg on an unbound socket is ENOTCONN (RDS has no autobind on send); so is no destination."""
    _a, b = rds_pair
    s = rds_socket_factory()
    expect_errno(errno.ENOTCONN, s.sendto, b"x", b.getsockname())
    s.bind((V4, 0))
    expect_errno(errno.ENOTCONN, s.send, b"x")


def test_send_family_mismatch(rds_socket_factory):
    """A socket bound to IPv4 cannot send to an IPv6 address and vice versa: EOPNOTSUPP (rds_sendmsg)."""
    a, b = rds_socket_factory(), rds_socket_factory()
    a.bind((V4, 0))
    b.bind((V6, 0))
    expect_errno(errno.EOPNOTSUPP, a.sendto, b"x", b.getsockname())
    expect_errno(errno.EOPNOTSUPP, b.sendto, b"x", (V4, a.getsockname()[1]))


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except OSError as exc:
        return ("err", errno.errorcode.get(exc.errno or 0, exc.errno))


@pytest.mark.parametrize("bound", [V4, V6], ids=["v4-to-v6", "v6-to-v4"])
def test_connected_send_to_the_other_family(rds_socket_factory, rds_observe, bound):
    """connect() to a local peer of the other address family, then send() with no name: rds_sendmsg's
    "IPv4/IPv6 address mismatch" check applies to an explicit destination only. 7.3 (guest, 2026-11-24)
    accepts the connect and delivers the message, source the bound address. Observed per kernel; whatever a
    kernel does, a send that succeeds must deliver to the peer with the sender's address as source."""
    other = V6 if bound == V4 else V4
    a, b = rds_socket_factory(), rds_socket_factory()
    a.bind((bound, 0))
    b.bind((other, 0))
    b.settimeout(5)
    connect = _outcome(a.connect, b.getsockname())
    send = _outcome(a.send, b"mixed") if connect[0] == "ok" else ("skipped",)
    got = None
    if send[0] == "ok":
        data, src = b.recvfrom(100)
        assert data == b"mixed" and src[:2] == a.getsockname()[:2]
        got = (data, len(src))
    rds_observe("mixed_family", (connect, send, got))


@pytest.mark.parametrize(
    "dest",
    [("0.0.0.0", 4000), ("255.255.255.255", 4000), ("224.0.0.1", 4000)],
    ids=["any", "broadcast", "multicast"],
)
def test_sendto_bad_destination(rds_pair, dest):
    a, _b = rds_pair
    expect_errno(errno.EINVAL, a.sendto, b"x", dest)


def test_unsupported_socket_calls(rds_socket_factory):
    """listen/accept/shutdown are EOPNOTSUPP (sock_no_* in rds_proto_ops)."""
    s = rds_socket_factory()
    expect_errno(errno.EOPNOTSUPP, s.listen, 1)
    expect_errno(errno.EOPNOTSUPP, s.accept)
    expect_errno(errno.EOPNOTSUPP, s.shutdown, socket.SHUT_RDWR)


def test_bad_python_arguments_raise_before_syscall(rds_socket_factory):
    s = rds_socket_factory()
    with pytest.raises(TypeError):
        s.bind("127.0.0.1")
    with pytest.raises(OverflowError):
        s.bind((V4, 70000))
    with pytest.raises((TypeError, ValueError)):
        s.bind(("127.0.0.1", 4000, 0, 0))
    for short in ((), ("127.0.0.1",)):  # the userspace client raised IndexError for () until 2026-12-03
        with pytest.raises(TypeError):
            s.sendto(b"x", short)
