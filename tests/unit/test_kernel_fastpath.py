"""The kernel backend's stdlib data path, on the host: an RDSSocket around UDP fds (same MSG_TRUNC and address
rules as AF_RDS for these calls), and the address route that replaces the ctypes sockaddr builders."""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fastcall_check import fastcall_module, python_calls_during

from pyrds import uapi
from pyrds.addr import parse_address
from pyrds.kernel import libc
from pyrds.kernel import socket as ksock
from pyrds.kernel.socket import RDSSocket, route


@pytest.fixture(autouse=True, params=["C", "pure"])
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on both data paths: the C calls of pyrds/kernel/_fastcall.c (when built; see
    test_kernel_fastcall.py for when a missing module fails) and the pure-Python closures."""
    if request.param == "C":
        fastcall_module()
    else:
        monkeypatch.setattr(ksock, "FASTCALL", None)
    return str(request.param)


def _udp(family: int = socket.AF_INET) -> RDSSocket:
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0) if family == socket.AF_INET else ("::1", 0))
    return RDSSocket(fileno=s.detach())


@pytest.fixture
def pair() -> Iterator[tuple[RDSSocket, RDSSocket]]:
    a, b = _udp(), _udp()
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def pair6() -> Iterator[tuple[RDSSocket, RDSSocket]]:
    try:
        a, b = _udp(socket.AF_INET6), _udp(socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def no_ctypes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any libc call through ctypes fails the test."""

    def refuse(name: str, *args: Any) -> int:
        raise AssertionError(f"ctypes libc.{name} called on the data path")

    monkeypatch.setattr(libc, "_call", refuse)
    monkeypatch.setattr(libc, "libc", lambda: pytest.fail("ctypes libc loaded on the data path"))


def _sockaddr_bytes(address: Any) -> bytes:
    """What the ctypes path built for an address (the reference the route must match)."""
    a = parse_address(address)
    if a.ip.version == 6:
        return uapi.to_bytes(uapi.make_sockaddr_in6(str(a.ip), a.port, a.flowinfo, a.scope_id))
    return uapi.to_bytes(uapi.make_sockaddr_in(str(a.ip), a.port))


def _stdlib_sockaddr_bytes(v6: bool, addr: Any) -> bytes:
    """The sockaddr CPython builds for ``addr`` on an AF_INET/AF_INET6 socket (read back via inet_pton)."""
    if v6:
        host, port, flowinfo, scope_id = addr
        return uapi.to_bytes(uapi.make_sockaddr_in6(host, port, flowinfo, scope_id))
    host, port = addr
    return uapi.to_bytes(uapi.make_sockaddr_in(host, port))


@pytest.mark.parametrize(
    "address",
    [
        ("127.0.0.1", 4000),
        ("10.1.2.3", 0),
        ("", 7),
        ("::1", 4000),
        ("::1", 4000, 0, 0),
        ("FD00:0:0::1", 65535, 5, 7),
        ("::ffff:10.0.0.1", 9, 0, 0),
        ("0.0.0.0", 1),
    ],
)
def test_route_gives_the_same_sockaddr(address: Any) -> None:
    v6, addr = route(address)
    assert v6 == (parse_address(address).ip.version == 6)
    assert _stdlib_sockaddr_bytes(v6, addr) == _sockaddr_bytes(address)
    assert route(address) == (v6, addr)  # cached or not, the same answer


@pytest.mark.parametrize(
    ("address", "exc"),
    [
        ("127.0.0.1", TypeError),
        (["127.0.0.1", 1], TypeError),
        (("127.0.0.1",), TypeError),
        (("127.0.0.1", 1, 0), TypeError),
        (("127.0.0.1", True), TypeError),
        (("127.0.0.1", 1.0), TypeError),
        ((b"127.0.0.1", 1), TypeError),
        (("127.0.0.1", 70000), OverflowError),
        (("127.0.0.1", -1), OverflowError),
        (("127.0.0.1", 1, 0, 0), ValueError),
        (("::1", 1, 1 << 20, 0), OverflowError),
        (("::1", 1, 0, 1 << 32), OverflowError),
        (("no-such-host.invalid", 1), ValueError),
    ],
)
def test_route_errors_are_parse_address_errors(address: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        parse_address(address)
    # also after an equal, valid address was cached (a bool port compares equal to 1)
    route(("127.0.0.1", 1))
    with pytest.raises(exc):
        route(address)


def test_route_caches_only_literal_exact_addresses() -> None:
    ksock._ROUTES.clear()
    route(("127.0.0.1", 5))
    route(("::1", 5))  # a 2-tuple IPv6 address: not the canonical 4-tuple text, still cached (numeric)
    route(("localhost", 5))  # a name: resolved every time
    assert ("127.0.0.1", 5) in ksock._ROUTES
    assert ("localhost", 5) not in ksock._ROUTES
    assert route(("localhost", 5)) == (False, ("127.0.0.1", 5))


def test_scoped_ipv6_text_fails_as_before() -> None:
    """The ctypes path sent str(ip) through inet_pton, which refuses a %scope suffix: still an OSError."""
    with pytest.raises(OSError):
        _sockaddr_bytes(("fe80::1%lo", 1, 0, 0))
    with pytest.raises(OSError):
        route(("fe80::1%lo", 1, 0, 0))


def test_data_calls_use_the_stdlib_not_ctypes(pair: tuple[RDSSocket, RDSSocket], no_ctypes: None) -> None:
    a, b = pair
    dest = b.getsockname()
    # the calls are instance attributes: the C methods themselves, or closures over them
    assert type(a.send).__name__ == "builtin_function_or_method"
    assert type(b.recvmsg).__name__ == "builtin_function_or_method"
    assert isinstance(b.recvmsg.__self__, socket.socket)  # type: ignore[attr-defined]
    assert a.sendto(b"one", dest) == 3
    assert b.recvfrom(100) == (b"one", a.getsockname())
    assert a.sendto(b"two", 0, dest) == 3
    assert a.sendmsg([b"th", b"ree"], [], 0, dest) == 5
    assert b.recv(100) == b"two"
    assert b.recvmsg(100) == (b"three", [], 0, a.getsockname())
    a.sendto(b"four", dest)
    buf = bytearray(8)
    assert b.recv_into(buf) == 4 and buf[:4] == b"four"
    a.sendto(b"five", dest)
    assert b.recvfrom_into(buf, 6) == (4, a.getsockname())
    a.connect(dest)
    assert a.send(b"six") == 3
    assert b.recv(10) == b"six"


def test_msg_trunc_returns_the_head_only(pair: tuple[RDSSocket, RDSSocket]) -> None:
    """CPython grows recv's bytes to the full length with MSG_TRUNC (garbage past bufsize) and recv_into
    returns the full length: pyrds returns what was stored, like recvmsg."""
    a, b = pair
    dest = b.getsockname()
    trunc = socket.MSG_TRUNC
    for _ in range(4):
        a.sendto(b"0123456789", dest)
    assert b.recv(4, trunc) == b"0123"
    assert b.recvfrom(3, trunc) == (b"012", a.getsockname())
    buf = bytearray(b"abcdefgh")
    assert b.recv_into(buf, 2, trunc) == 2
    assert buf == b"01cdefgh"
    small = bytearray(3)
    assert b.recvfrom_into(small, 0, trunc) == (3, a.getsockname())
    assert small == b"012"
    a.sendto(b"0123456789", dest)
    data, anc, flags, addr = b.recvmsg(4, 0, trunc)
    assert (data, anc, addr) == (b"0123", [], a.getsockname()) and flags & trunc


def test_short_buffer_without_msg_trunc(pair: tuple[RDSSocket, RDSSocket]) -> None:
    a, b = pair
    dest = b.getsockname()
    a.sendto(b"0123456789", dest)
    a.sendto(b"next", dest)
    view = memoryview(bytearray(8))
    assert b.recvfrom_into(view, 4) == (4, a.getsockname())
    assert bytes(view[:4]) == b"0123"
    assert b.recv_into(view) == 4 and bytes(view[:4]) == b"next"


def test_ipv6_addresses_are_4_tuples(pair6: tuple[RDSSocket, RDSSocket]) -> None:
    a, b = pair6
    dest = b.getsockname()
    assert len(dest) == 4 and dest[0] == "::1"
    a.sendto(b"x", dest)
    assert b.recvfrom(10) == (b"x", a.getsockname())
    a.sendto(b"y", ("::1", dest[1]))  # a 2-tuple IPv6 address is accepted
    buf = bytearray(4)
    n, src = b.recvfrom_into(buf)
    assert (n, src) == (1, a.getsockname()) and len(src) == 4
    a.sendmsg([b"z"], (), 0, dest)
    assert b.recvmsg(10)[3] == a.getsockname()


def test_bad_arguments(pair: tuple[RDSSocket, RDSSocket]) -> None:
    a, b = pair
    dest = b.getsockname()
    a.sendto(b"x", ("127.0.0.1", 1))  # cache ('127.0.0.1', 1); True == 1 must still be refused
    cases: list[tuple[Any, type[Exception]]] = [
        (lambda: a.sendto(b"x", ("127.0.0.1", True)), TypeError),
        (lambda: a.sendto(b"x", "127.0.0.1"), TypeError),
        (lambda: a.sendto(b"x", ("127.0.0.1", 70000)), OverflowError),
        (lambda: a.sendto(b"x", ("127.0.0.1", 1, 0, 0)), ValueError),
        (lambda: a.sendto("text", dest), TypeError),
        (lambda: a.sendto(b"x", "0", dest), TypeError),
        (lambda: a.sendto(b"x"), TypeError),
        (lambda: a.sendto(b"x", 0, dest, 1), TypeError),
        (lambda: a.sendmsg([b"x"], [[1, 2, b""]], 0, dest), TypeError),
        (lambda: a.sendmsg([b"x"], [("1", 2, b"")], 0, dest), TypeError),
        (lambda: a.sendmsg("not buffers", [], 0, dest), TypeError),
        (lambda: b.recv(-1), ValueError),
        (lambda: b.recv("10"), TypeError),
        (lambda: b.recvfrom(-1), ValueError),
        (lambda: b.recvmsg(-1), ValueError),
        (lambda: b.recvmsg(10, -1), ValueError),
        (lambda: b.recv_into(b"read-only"), TypeError),
        (lambda: b.recv_into(bytearray(4), 5), ValueError),
        (lambda: b.recv_into(bytearray(4), -1), ValueError),
        (lambda: b.recvfrom_into(bytearray(4), 5), ValueError),
        (lambda: b.recv(10, "0"), TypeError),
    ]
    for bad in (None, 0.0, "", 1.5):  # falsy or not, a non-int flags value is refused, as before
        cases += [
            (lambda bad=bad: b.recv(10, bad), TypeError),
            (lambda bad=bad: b.recvfrom(10, bad), TypeError),
            (lambda bad=bad: b.recv_into(bytearray(4), 0, bad), TypeError),
            (lambda bad=bad: b.recvmsg(10, 0, bad), TypeError),
            (lambda bad=bad: a.sendto(b"x", bad, dest), TypeError),
            (lambda bad=bad: a.sendmsg([b"x"], [], bad, dest), TypeError),
        ]
    for call, exc in cases:
        with pytest.raises(exc):
            call()
    # nothing was sent or consumed by the refused calls
    a.sendto(b"still", dest)
    assert b.recv(100) == b"still"


def test_destination_cache_follows_the_address(pair: tuple[RDSSocket, RDSSocket]) -> None:
    a, b = pair
    c = _udp()
    c.settimeout(5)
    try:
        host_b, port_b = b.getsockname()
        host_c, port_c = c.getsockname()
        for i in range(3):
            a.sendto(b"b%d" % i, (host_b, int(str(port_b))))  # equal, never the same tuple object
            a.sendmsg([b"c%d" % i], [], 0, (host_c, port_c))
        assert [b.recv(10) for _ in range(3)] == [b"b0", b"b1", b"b2"]
        assert [c.recv(10) for _ in range(3)] == [b"c0", b"c1", b"c2"]
    finally:
        c.close()


def test_timeouts_and_nonblocking(pair: tuple[RDSSocket, RDSSocket]) -> None:
    _a, b = pair
    b.settimeout(0.05)
    for call in (lambda: b.recv(1), lambda: b.recvfrom_into(bytearray(1)), lambda: b.recvmsg(1)):
        with pytest.raises(TimeoutError) as ei:
            call()
        assert ei.value.errno is None
    b.setblocking(False)
    assert b.gettimeout() == 0.0
    with pytest.raises(BlockingIOError):
        b.recv_into(bytearray(1))
    with pytest.raises(BlockingIOError):
        b.recv(1, socket.MSG_TRUNC)


def test_closed_and_detached(pair: tuple[RDSSocket, RDSSocket]) -> None:
    a, b = pair
    dest = b.getsockname()
    fd = a.detach()
    assert a.fileno() == -1
    for call in (
        lambda: a.sendto(b"x", dest),
        lambda: a.send(b"x"),
        lambda: a.recv(1),
        lambda: a.recvmsg(1),
        lambda: a.recv_into(bytearray(1)),
        lambda: a.getsockname(),
    ):
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == 9
    # the fd survived the detach (and the views' finalizers)
    gc.collect()
    std = socket.socket(fileno=fd)
    with std:
        std.sendto(b"after", dest)
        assert b.recv(10) == b"after"


def test_fileno_runs_no_python_frame_and_follows_close(pair: tuple[RDSSocket, RDSSocket]) -> None:
    """fileno() is asked for on every wait (selectors, asyncio's sock_*, pyrds stress): a C method, as on a
    stdlib socket, and -1 once the socket is closed (detach: test_closed_and_detached)."""
    a, b = pair
    fd = a.fileno()
    assert fd >= 0 and os.fstat(fd)
    assert python_calls_during(lambda: a.fileno()) == []
    assert type(a).fileno(a) == fd  # the class's entry point agrees
    a.close()
    assert a.fileno() == -1 and type(a).fileno(a) == -1


def test_views_never_close_the_fd() -> None:
    s = _udp()
    fd = s.fileno()
    view = ksock._View(socket.AF_INET, socket.SOCK_DGRAM, 0, fd)
    del view
    gc.collect()
    os.fstat(fd)  # still open
    assert s.getsockname()[0] == "127.0.0.1"
    s.close()
    assert s.fileno() == -1
    with pytest.raises(OSError):
        os.fstat(fd)


def test_subclass_override_is_kept() -> None:
    class Mine(RDSSocket):
        def recv(self, bufsize: int, flags: int = 0) -> bytes:
            return b"mine"

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    m = Mine(fileno=s.detach())
    try:
        assert m.recv(1) == b"mine"
        assert type(m.send).__name__ == "builtin_function_or_method"
        assert type(m.fileno).__name__ == "builtin_function_or_method"
    finally:
        m.close()

    class OwnFileno(RDSSocket):
        def fileno(self) -> int:
            return 4242

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    m = OwnFileno(fileno=s.detach())
    try:
        assert m.fileno() == 4242
    finally:
        m.close()


def test_stdlib_parity_attributes() -> None:
    s = _udp()
    try:
        assert s.family == socket.AF_RDS and s.type == socket.SOCK_SEQPACKET and s.proto == 0
        assert f"fd={s.fileno()}" in repr(s) and "laddr=('127.0.0.1'" in repr(s)
        d = s.dup()
        try:
            assert d.fileno() not in (-1, s.fileno()) and d.getsockname() == s.getsockname()
        finally:
            d.close()
    finally:
        s.close()
    assert "[closed]" in repr(s)


def test_default_timeout_is_not_inherited() -> None:
    """socket.setdefaulttimeout() makes stdlib sockets non-blocking; an RDSSocket starts with timeout None and
    a blocking fd (as with the ctypes socket), an adopted fd keeps its mode."""
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(3.0)
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        raw.setblocking(True)
        s = RDSSocket(fileno=raw.detach())
        try:
            assert s.gettimeout() is None and s._v4.gettimeout() is None and s._v6.gettimeout() is None
            assert os.get_blocking(s.fileno())
        finally:
            s.close()
        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        raw.setblocking(False)
        s = RDSSocket(fileno=raw.detach())
        try:
            assert not os.get_blocking(s.fileno()) and s.gettimeout() is None
        finally:
            s.close()
    finally:
        socket.setdefaulttimeout(old)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_data_call_taken_from_a_socket_keeps_it_open() -> None:
    """``recv = s.recv; del s``: the stdlib's bound method keeps its socket, so the call still works; here the
    data calls are the instance's closures (or C objects), which hold the views, which hold the fd."""
    a, b = _udp(), _udp()
    dest = b.getsockname()
    fd = b.fileno()
    b.settimeout(5)
    recvfrom, send_back = b.recvfrom, b.sendto
    del b
    gc.collect()
    assert not _closed(fd)
    a.sendto(b"after del", dest)
    data, src = recvfrom(64)
    assert (data, src) == (b"after del", a.getsockname())
    assert send_back(b"reply", src) == 5
    a.settimeout(5)
    assert a.recv(64) == b"reply"
    del recvfrom, send_back
    assert _closed(fd)  # the last holder gone: closed by reference counting, no collection needed
    a.close()


def test_a_socket_alone_closes_its_fd_when_it_goes() -> None:
    s = _udp()
    fd = s.fileno()
    del s
    assert _closed(fd)


def test_close_reaches_a_data_call_taken_before() -> None:
    a, b = _udp(), _udp()
    recv, sendto = b.recv, b.sendto
    fd = b.fileno()
    b.close()
    assert _closed(fd)
    for call in (lambda: recv(1), lambda: sendto(b"x", a.getsockname())):
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == 9
    a.close()


def test_detach_leaves_the_fd_open_after_everything_is_gone() -> None:
    s = _udp()
    recv = s.recv
    fd = s.detach()
    del s, recv
    gc.collect()
    assert not _closed(fd)
    os.close(fd)
