"""Client <-> stack service RPC: binary data-path records, plain conversion of IntEnum/IntFlag arguments,
errors as errno (never a dropped control connection), the stack service start timeout."""

from __future__ import annotations

import array
import enum
import errno
import socket
import time

import pytest

from pyrds.constants import SOL_RDS, SockOpt, Transport
from pyrds.userspace import rpc
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.client import autostart as client
from pyrds.userspace.service.replies import error_reply as _error
from pyrds.userspace.stack.errors import StackError


class Port(enum.IntEnum):
    A = 4711
    B = 4712


def test_encode_converts_int_subclasses() -> None:
    record = rpc.encode((int(rpc.Op.SEND), (socket.MSG_DONTWAIT, Transport.TCP, [Port.A], {"k": Port.B})))
    op, (flags, trans, ports, d) = rpc.decode(record)
    assert (op, flags, trans, ports, d) == (4, int(socket.MSG_DONTWAIT), 2, [4711], {"k": 4712})
    assert type(flags) is int and type(trans) is int and type(ports[0]) is int
    assert rpc.decode(rpc.encode((True, None, b"x"))) == (True, None, b"x")


def test_service_errors_are_plain_errnos() -> None:
    class E(enum.IntEnum):
        INUSE = errno.EADDRINUSE

    code, extra = _error(StackError(E.INUSE))
    assert (code, extra) == (errno.EADDRINUSE, None) and type(code) is int
    rpc.encode((code, extra))
    assert _error(ValueError("bad host"))[0] == errno.EINVAL
    assert _error(OSError(errno.ENOENT, "x"))[0] == errno.ENOENT


def test_intenum_arguments_and_failed_bind_errno() -> None:
    a, b = RDSSocket(), RDSSocket()
    a.bind(("127.0.0.1", Port.A))  # an IntEnum port crossed marshal as "unmarshallable object"
    assert a.getsockname() == ("127.0.0.1", 4711)
    with pytest.raises(OSError) as ei:
        b.bind(("127.0.0.1", Port.A))
    assert ei.value.errno == errno.EADDRINUSE and not isinstance(ei.value, ValueError)
    b.bind(("127.0.0.1", Port.B))
    assert b.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.LOOP
    b.connect(("127.0.0.1", Port.A))
    assert b.sendto(b"x", socket.MSG_DONTWAIT, ("127.0.0.1", Port.A)) == 1
    data, addr = a.recvfrom(10, socket.MSG_DONTWAIT)
    assert (data, addr) == (b"x", ("127.0.0.1", 4712))
    assert b.send(b"y", socket.MSG_DONTWAIT) == 1
    assert a.recv(10, socket.MSG_DONTWAIT) == b"y"
    a.close()
    b.close()


def test_bad_request_is_einval_and_the_socket_lives_on() -> None:
    s = RDSSocket()
    with pytest.raises(OSError) as ei:
        s._call(rpc.Op.BIND, ("not-an-address", 1, 0))
    assert ei.value.errno == errno.EINVAL
    s.bind(("127.0.0.1", 0))  # the control connection was not dropped
    s.close()


def test_data_path_buffers_sizes_and_errnos() -> None:
    a, b = RDSSocket(), RDSSocket()
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    dest = a.getsockname()
    parts = [b"ab", bytearray(b"cd"), memoryview(b"xxef")[2:], array.array("B", b"gh")]
    assert b.sendmsg(parts, (), 0, dest) == 8
    assert a.recvmsg(100)[0] == b"abcdefgh"
    for size in (0, 1, 65536, rpc.MAX_PACKET, (1 << 20)):  # one packet and several
        payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
        assert b.sendto(payload, dest) == size
        data, _anc, flags, addr = a.recvmsg(size + 1)
        assert data == payload and flags == 0 and addr == b.getsockname()
    b.sendto(b"0123456789", dest)
    data, _anc, flags, _addr = a.recvmsg(4)
    assert data == b"0123" and flags & socket.MSG_TRUNC
    with pytest.raises(OSError) as ei:
        b.sendto(b"x" * ((1 << 20) + 1), dest)
    assert ei.value.errno == errno.EMSGSIZE
    with pytest.raises(OverflowError, match="signed integer is greater than maximum"):
        b.sendto(b"x", 1 << 40, dest)  # flags beyond a C int: the stdlib's (and the kernel backend's) error
    with pytest.raises(OSError) as ei:
        b.sendto(b"x", socket.MSG_OOB, dest)
    assert ei.value.errno == errno.EOPNOTSUPP
    a.setblocking(False)
    with pytest.raises(BlockingIOError):
        a.recv(10)  # answered from the readiness fd
    with pytest.raises(OSError) as ei:
        a.recv(10, socket.MSG_OOB)  # still the stack's answer
    assert ei.value.errno == errno.EOPNOTSUPP
    a.setblocking(True)
    b.sendto(b"late", dest)
    assert a.recv(10) == b"late"
    a.close()
    with pytest.raises(OSError) as ei:
        a.recv(10)
    assert ei.value.errno == errno.EBADF
    b.close()


def test_ipv6_source_address_and_cmsgs() -> None:
    a, b = RDSSocket(), RDSSocket()
    a.bind(("::1", 0))
    b.bind(("::1", 0))
    a.setsockopt(socket.SOL_SOCKET, 29, 1)  # SO_TIMESTAMP_OLD
    b.sendto(b"six", a.getsockname())
    data, anc, _flags, addr = a.recvmsg(10, 1024)
    assert data == b"six" and addr == b.getsockname() and len(addr) == 4
    assert anc and all(isinstance(level, int) and isinstance(item, bytes) for level, _k, item in anc)
    a.close()
    b.close()


def test_start_timeout_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYRDS_START_TIMEOUT", raising=False)
    assert client.start_timeout() >= 60.0  # a loaded TCG guest needs tens of seconds
    monkeypatch.setenv("PYRDS_START_TIMEOUT", "0.3")
    assert client.start_timeout() == 0.3
    monkeypatch.setattr(client, "spawn_service", lambda *options: None)  # nothing will ever listen
    t0 = time.monotonic()
    with pytest.raises(OSError) as ei:
        client.connect_stack()
    assert ei.value.errno == errno.ECONNREFUSED and 0.25 < time.monotonic() - t0 < 5.0
