"""The kernel backend's data calls run in CPython's socket code on the real AF_RDS (issue 10, part 1): no
ctypes on the data path, the stdlib's results with pyrds's MSG_TRUNC rule, IPv6 sources as 4-tuples, IPv4
sources as 2-tuples, cmsgs byte for byte, the same errors as the stdlib for bad arguments."""

from __future__ import annotations

import errno
import socket
from typing import Any

import pytest
from kernel_helpers import errno_of, loop_pair

from pyrds import cmsg
from pyrds.constants import AF_RDS, SOL_RDS, InfoType, SockOpt
from pyrds.kernel import RDSSocket, libc
from pyrds.kernel import socket as ksock
from tests.unit.fastcall_check import fastcall_module, python_calls_during


@pytest.fixture(params=["C", "pure"])
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C data calls (pyrds/kernel/_fastcall.c; a missing module fails under CI or
    PYRDS_REQUIRE_FASTCALL=1, else skips) or the pure-Python closures, for the sockets made after it."""
    if request.param == "C":
        fastcall_module()
    else:
        monkeypatch.setattr(ksock, "FASTCALL", None)
    return str(request.param)


@pytest.fixture
def no_ctypes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str, *args: Any) -> int:
        raise AssertionError(f"ctypes libc.{name} called on the data path")

    monkeypatch.setattr(libc, "_call", refuse)


def test_data_calls_never_touch_ctypes(data_path: str, sockets: list[Any], no_ctypes: None) -> None:
    a, b = loop_pair(sockets, port=4610)
    b.settimeout(10)
    dest, src = b.getsockname(), a.getsockname()
    assert type(a.send).__name__ == "builtin_function_or_method"
    assert isinstance(b.recvmsg.__self__, socket.socket)
    assert a.sendto(b"one", dest) == 3
    assert a.sendto(b"two", socket.MSG_DONTWAIT, dest) == 3
    assert a.sendmsg([b"th", b"ree"], [], 0, dest) == 5
    assert b.recvfrom(100) == (b"one", src)
    assert b.recv(100) == b"two"
    assert b.recvmsg(100, 64) == (b"three", [], 0, src)
    a.sendto(b"four", dest)
    a.sendto(b"five", dest)
    buf = bytearray(16)
    assert b.recv_into(buf) == 4 and buf[:4] == b"four"
    assert b.recvfrom_into(buf, 8) == (4, src) and buf[:4] == b"five"
    a.connect(dest)
    assert a.send(b"six") == 3
    assert b.recv(10) == b"six"


def test_msg_trunc_keeps_pyrds_rule(data_path: str, sockets: list[Any]) -> None:
    """RDS returns the full length with MSG_TRUNC; pyrds returns what was stored (CPython's recv would grow
    the bytes past bufsize, its recv_into would return the full length)."""
    a, b = loop_pair(sockets, port=4620)
    b.settimeout(10)
    dest, src = b.getsockname(), a.getsockname()
    trunc = socket.MSG_TRUNC
    for _ in range(5):
        a.sendto(b"0123456789", dest)
    assert b.recv(4, trunc) == b"0123"
    assert b.recvfrom(2, trunc) == (b"01", src)
    small = bytearray(b"abcdef")
    assert b.recv_into(small, 3, trunc) == 3 and small == b"012def"
    assert b.recvfrom_into(bytearray(5), 0, trunc) == (5, src)
    data, anc, flags, addr = b.recvmsg(4, 0, trunc)
    assert (data, anc, addr) == (b"0123", [], src) and flags & trunc
    # without MSG_TRUNC a short buffer gets the head and the message is consumed
    a.sendto(b"0123456789", dest)
    a.sendto(b"next", dest)
    assert b.recv_into(small, 2) == 2 and small[:2] == b"01"
    assert b.recv(100) == b"next"


def test_ipv6_sources_are_4_tuples(data_path: str, sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, host="::1", port=4630)
    b.settimeout(10)
    dest, src = b.getsockname(), a.getsockname()
    assert len(dest) == 4 and dest[:2] == ("::1", 4631)
    a.sendto(b"x", dest)
    a.sendto(b"y", ("::1", 4631))  # 2-tuple IPv6 address
    a.sendmsg([b"z"], [], 0, dest)
    assert b.recvfrom(10) == (b"x", src)
    buf = bytearray(4)
    assert b.recvfrom_into(buf) == (1, src) and buf[:1] == b"y"
    data, _anc, _flags, addr = b.recvmsg(10)
    assert (data, addr) == (b"z", src) and len(addr) == 4


def test_ipv4_sources_are_2_tuples_on_the_v6_view(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, port=4640)
    b.settimeout(10)
    a.sendto(b"x", b.getsockname())
    data, src = b.recvfrom(10)
    assert (data, src) == (b"x", ("127.0.0.1", 4640))


def test_cmsgs_through_the_stdlib(sockets: list[Any]) -> None:
    """SO_TIMESTAMP arrives as a cmsg that pyrds.cmsg parses; a too-small ancillary buffer sets MSG_CTRUNC."""
    a, b = loop_pair(sockets, port=4650)
    b.settimeout(10)
    b.setsockopt(socket.SOL_SOCKET, cmsg.SO_TIMESTAMP_OLD, 1)
    a.sendto(b"ts", b.getsockname())
    data, anc, flags, _addr = b.recvmsg(10, 256)
    assert data == b"ts" and not flags & socket.MSG_CTRUNC
    assert [(lvl, typ) for lvl, typ, _ in anc] == [(socket.SOL_SOCKET, cmsg.SO_TIMESTAMP_OLD)]
    assert len(anc[0][2]) == 16  # struct timeval, whole
    assert [type(x) for x in cmsg.parse_ancdata(anc)] == [cmsg.Timestamp]
    a.sendto(b"ts", b.getsockname())
    _data, anc, flags, _addr = b.recvmsg(10, 4)
    assert flags & socket.MSG_CTRUNC and anc == []


def test_sendmsg_cmsg_errno_passes_through(sockets: list[Any]) -> None:
    """An RDS cmsg the loop transport cannot honour: the kernel's errno, as before."""
    a, b = loop_pair(sockets, port=4660)
    bad = (SOL_RDS, 99, b"\0" * 8)
    assert errno_of(lambda: a.sendmsg([b"x"], [bad], 0, b.getsockname())) == errno.EINVAL


def test_errors_match_the_stdlib_socket(data_path: str, sockets: list[Any]) -> None:
    """Kernel errnos and argument errors: pyrds.kernel and a stdlib AF_RDS socket side by side."""
    a, b = loop_pair(sockets, port=4670)
    std = socket.socket(AF_RDS, socket.SOCK_SEQPACKET)
    std.bind(("127.0.0.1", 4672))
    std.setblocking(False)
    a.setblocking(False)
    try:
        dest = b.getsockname()
        same = [
            (lambda s: s.recv(10), "EAGAIN"),
            (lambda s: s.recvfrom(10), "EAGAIN"),
            (lambda s: s.recv_into(bytearray(4)), "EAGAIN"),
            (lambda s: s.recvmsg(10), "EAGAIN"),
            (lambda s: s.sendto(b"x", socket.MSG_OOB, dest), "EOPNOTSUPP"),
            (lambda s: s.sendto(b"x", ("0.0.0.0", 1)), None),
            (lambda s: s.sendto(b"x" * ((1 << 20) + 1), dest), "EMSGSIZE"),
            (lambda s: s.send(b"x"), "ENOTCONN"),
            (lambda s: s.recv(-1), "ValueError"),
            (lambda s: s.recv_into(b"ro"), "TypeError"),
            (lambda s: s.recvfrom_into(bytearray(2), 3), "ValueError"),
            (lambda s: s.sendto("str", dest), "TypeError"),
            (lambda s: s.sendto(b"x", ("127.0.0.1", 70000)), "OverflowError"),
        ]
        for call, expected in same:
            outcomes = []
            for sock in (a, std):
                try:
                    call(sock)
                    outcomes.append("ok")
                except OSError as exc:
                    outcomes.append(
                        errno.errorcode.get(exc.errno or 0, str(exc.errno)).replace("ENOTSUP", "EOPNOTSUPP")
                    )
                except (TypeError, ValueError, OverflowError) as exc:
                    outcomes.append(type(exc).__name__)
            assert outcomes[0] == outcomes[1], (expected, outcomes)
            if expected is not None:
                assert outcomes[0] == expected
    finally:
        std.close()


@pytest.mark.parametrize(("host", "port"), [("127.0.0.1", 4700), ("::1", 4710)])
def test_c_data_calls_run_no_python_frame(sockets: list[Any], host: str, port: int) -> None:
    """With the C module, sendto/sendmsg to a known destination (also a reply to the source recvfrom gave),
    every receive without MSG_TRUNC, and fileno() enter no Python function on a real AF_RDS socket, IPv4 and
    IPv6 (issue 10: the stdlib's cost per call)."""
    fastcall_module()
    a, b = loop_pair(sockets, host=host, port=port)
    b.settimeout(10)
    dest, src = b.getsockname(), a.getsockname()
    a.settimeout(10)
    a.sendto(b"warm", dest)  # learns the route: one Python call per new destination
    assert b.recvfrom(10) == (b"warm", src)
    b.sendto(b"back", src)
    assert a.recvfrom(10) == (b"back", dest)
    buf = bytearray(8)
    results: list[Any] = []
    fd = b.fileno()

    def traffic() -> None:
        results.append(b.fileno() == fd)  # asked for on every wait (selectors, asyncio): a C method too
        results.append(a.sendto(b"one", dest))
        results.append(a.sendmsg([b"tw", b"o"], [], 0, dest))
        results.append(a.sendto(b"three", socket.MSG_DONTWAIT, dest))
        results.append(b.recvfrom(10))
        results.append(b.recv(10, socket.MSG_DONTWAIT))
        results.append(b.recvfrom_into(buf, 8))
        # a server's reply to the source recvfrom gave (a new tuple, equal to the one learned)
        a.sendto(b"ping", dest)
        data, source = b.recvfrom(10)
        results.append(b.sendto(data, source))
        results.append(a.recvfrom(10))

    assert python_calls_during(traffic) == []
    assert results == [True, 3, 3, 5, (b"one", src), b"two", (5, src), 4, (b"ping", dest)]
    assert buf[:5] == b"three"


def test_rds_info_and_large_getsockopt_still_work(sockets: list[Any]) -> None:
    a, _b = loop_pair(sockets, port=4680)
    assert a.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) >= 0
    each, raw = a.get_info_raw(InfoType.RDS_INFO_COUNTERS)  # ctypes: more than 1024 bytes
    assert each == 40 and len(raw) > 1024
    big = a.getsockopt(SOL_RDS, InfoType.RDS_INFO_COUNTERS, 65536)  # over CPython's 1024-byte cap
    assert isinstance(big, bytes) and len(big) == len(raw)
    assert errno_of(lambda: a.getsockopt(SOL_RDS, InfoType.RDS_INFO_COUNTERS, 64)) == errno.ENOSPC


def test_detach_dup_repr(sockets: list[Any]) -> None:
    a, b = loop_pair(sockets, port=4690)
    b.settimeout(10)
    d = a.dup()
    sockets.append(d)
    assert d.getsockname() == a.getsockname() and d.gettimeout() == a.gettimeout()
    d.sendto(b"dup", b.getsockname())
    assert b.recvfrom(10) == (b"dup", a.getsockname())
    assert a.family == AF_RDS and a.type == socket.SOCK_SEQPACKET and a.proto == 0
    assert "laddr=('127.0.0.1', 4690)" in repr(a)
    fd = d.detach()
    assert d.fileno() == -1
    assert errno_of(lambda: d.recv(1)) == errno.EBADF
    std = socket.socket(fileno=fd)
    with std:  # the fd survived the detach: still the AF_RDS socket
        assert std.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == AF_RDS
    wrapped = RDSSocket(fileno=socket.socket(AF_RDS, socket.SOCK_SEQPACKET).detach())
    sockets.append(wrapped)
    assert wrapped.getsockname() == ("0.0.0.0", 0)


def test_a_data_call_taken_from_a_socket_keeps_it_open(data_path: str) -> None:
    """AF_RDS: ``recv = s.recvfrom; del s`` keeps the socket, as the stdlib's bound method does (it raised
    EBADF: the socket object closed the fd while its data calls were still held)."""
    import gc
    import os

    a = RDSSocket()
    b = RDSSocket()
    try:
        a.bind(("127.0.0.1", 4240))
        b.bind(("127.0.0.1", 4241))
        b.settimeout(5)
        fd = b.fileno()
        recvfrom = b.recvfrom
        del b
        gc.collect()
        a.sendto(b"after del", ("127.0.0.1", 4241))
        assert recvfrom(64) == (b"after del", ("127.0.0.1", 4240))
        del recvfrom
        with pytest.raises(OSError) as ei:
            os.fstat(fd)
        assert ei.value.errno == errno.EBADF
        # the port is free again: the socket is gone with its last data call
        c = RDSSocket()
        c.bind(("127.0.0.1", 4241))
        c.close()
    finally:
        a.close()
