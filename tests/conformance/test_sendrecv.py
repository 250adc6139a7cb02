"""send/recv semantics on the loop transport: flags, truncation, peek, ordering, zero-length, buffer
limits."""

from __future__ import annotations

import errno
import socket
import time

import pytest

from pyrds.constants import InfoType
from pyrds.info import counters_dict
from pyrds.testing.helpers import expect_errno

MSG_ZEROCOPY = 0x4000000


def test_send_returns_length_and_recv_data(rds_pair):
    a, b = rds_pair
    payload = bytes(range(256)) * 16
    assert a.sendto(payload, b.getsockname()) == len(payload)
    data, src = b.recvfrom(65536)
    assert data == payload and src == a.getsockname()


def test_recvmsg_shape(rds_pair):
    a, b = rds_pair
    a.sendto(b"abc", b.getsockname())
    data, anc, flags, addr = b.recvmsg(100, 0)
    assert (data, anc, flags, addr) == (b"abc", [], 0, a.getsockname())


def test_sendmsg_gathers_buffers(rds_pair):
    a, b = rds_pair
    assert a.sendmsg([b"ab", b"", b"cde"], [], 0, b.getsockname()) == 5
    assert b.recv(100) == b"abcde"


def test_msg_peek(rds_pair):
    """MSG_PEEK returns the head message without consuming it (twice the same), then recv consumes it."""
    a, b = rds_pair
    a.sendto(b"first", b.getsockname())
    a.sendto(b"second", b.getsockname())
    assert b.recv(100, socket.MSG_PEEK) == b"first"
    assert b.recvfrom(100, socket.MSG_PEEK) == (b"first", a.getsockname())
    assert b.recv(100) == b"first"
    assert b.recv(100) == b"second"


def test_short_buffer_sets_msg_trunc_and_consumes(rds_pair, rds_observe):
    """A short buffer gets the head of the message, MSG_TRUNC in msg_flags, and the message is consumed."""
    a, b = rds_pair
    a.sendto(b"0123456789", b.getsockname())
    a.sendto(b"next", b.getsockname())
    data, _anc, flags, _addr = b.recvmsg(4)
    assert data == b"0123"
    assert flags & socket.MSG_TRUNC
    assert b.recv(100) == b"next"
    rds_observe("trunc_flags", flags)


def test_peek_short_buffer_keeps_message(rds_pair):
    a, b = rds_pair
    a.sendto(b"0123456789", b.getsockname())
    data, _anc, flags, _addr = b.recvmsg(3, 0, socket.MSG_PEEK)
    assert data == b"012" and flags & socket.MSG_TRUNC
    assert b.recv(100) == b"0123456789"


def test_recv_dontwait_empty_eagain(rds_socket_factory):
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    expect_errno(errno.EAGAIN, s.recv, 100, socket.MSG_DONTWAIT)


def test_recv_dontwait_on_timeout_socket_follows_stdlib(rds_pair):
    """Python-level rule, as CPython's socket: a socket with a timeout polls first, so MSG_DONTWAIT on an
    empty queue raises TimeoutError after the timeout (not EAGAIN at once)."""
    _a, b = rds_pair
    b.settimeout(0.3)
    with pytest.raises(TimeoutError):
        b.recv(100, socket.MSG_DONTWAIT)


def test_recv_timeout(rds_pair):
    """A timed recv on an empty queue raises TimeoutError (socket.timeout) after about the timeout."""
    _a, b = rds_pair
    b.settimeout(0.3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        b.recv(100)
    assert 0.2 < time.monotonic() - t0 < 3


def test_nonblocking_socket_eagain(rds_pair):
    _a, b = rds_pair
    b.setblocking(False)
    assert b.gettimeout() == 0.0
    expect_errno(errno.EAGAIN, b.recv, 100)


@pytest.mark.parametrize(
    "flag",
    [socket.MSG_OOB, socket.MSG_NOSIGNAL, socket.MSG_MORE, socket.MSG_CONFIRM, socket.MSG_EOR],
    ids=["OOB", "NOSIGNAL", "MORE", "CONFIRM", "EOR"],
)
def test_send_bad_flags_eopnotsupp(rds_pair, flag):
    """Only MSG_DONTWAIT (and MSG_ZEROCOPY/MSG_CMSG_COMPAT) are accepted by rds_sendmsg; the rest
    EOPNOTSUPP."""
    a, b = rds_pair
    expect_errno(errno.EOPNOTSUPP, a.sendto, b"x", flag, b.getsockname())


def test_send_dontwait_ok(rds_pair):
    a, b = rds_pair
    assert a.sendto(b"x", socket.MSG_DONTWAIT, b.getsockname()) == 1
    assert b.recv(10) == b"x"


def test_zerocopy_flag_without_cookie_einval(rds_pair):
    """Kernel 6.1: MSG_ZEROCOPY without an RDS_CMSG_ZCOPY_COOKIE is EINVAL (rds_rm_size), even without
    SO_ZEROCOPY and on the loop transport."""
    a, b = rds_pair
    expect_errno(errno.EINVAL, a.sendto, b"zc", MSG_ZEROCOPY, b.getsockname())


def test_ordering(rds_pair):
    a, b = rds_pair
    dest = b.getsockname()
    for i in range(200):
        a.sendto(i.to_bytes(4, "big") * (i % 7), dest)
    got = [b.recv(100) for _ in range(200)]
    assert got == [i.to_bytes(4, "big") * (i % 7) for i in range(200)]


def test_ordering_per_sender_interleaved(rds_socket_factory):
    """Two senders to one receiver: each sender's messages arrive in its own order."""
    r = rds_socket_factory()
    r.bind(("127.0.0.1", 0))
    r.settimeout(5)
    senders = []
    for _ in range(2):
        s = rds_socket_factory()
        s.bind(("127.0.0.1", 0))
        senders.append(s)
    for i in range(50):
        for k, s in enumerate(senders):
            s.sendto(f"{k}:{i}".encode(), r.getsockname())
    seen: dict[int, list[int]] = {s.getsockname()[1]: [] for s in senders}
    for _ in range(100):
        data, src = r.recvfrom(100)
        seen[src[1]].append(int(data.split(b":")[1]))
    assert all(v == list(range(50)) for v in seen.values())


def test_zero_length_message(rds_pair):
    """Zero-byte messages are real messages: send returns 0, recvfrom returns b'' and the source."""
    a, b = rds_pair
    assert a.sendto(b"", b.getsockname()) == 0
    a.sendto(b"after", b.getsockname())
    assert b.recvfrom(100) == (b"", a.getsockname())
    assert b.recv(100) == b"after"


def test_recv_zero_bufsize(rds_pair):
    a, b = rds_pair
    a.sendto(b"data", b.getsockname())
    data, _anc, flags, addr = b.recvmsg(0)
    assert data == b"" and flags & socket.MSG_TRUNC and addr == a.getsockname()


def test_emsgsize_over_half_sndbuf(rds_pair, rds_observe):
    """A payload larger than sndbuf/2 is EMSGSIZE; SO_SNDBUF is doubled by the core (min 4608)."""
    a, b = rds_pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    sndbuf = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert sndbuf == 16384
    limit = sndbuf // 2
    assert a.sendto(b"x" * limit, b.getsockname()) == limit
    expect_errno(errno.EMSGSIZE, a.sendto, b"x" * (limit + 1), b.getsockname())
    assert b.recv(limit) == b"x" * limit
    rds_observe("sndbuf", sndbuf)


def test_emsgsize_over_1mib(rds_pair):
    a, b = rds_pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    expect_errno(errno.EMSGSIZE, a.sendto, b"x" * ((1 << 20) + 1), b.getsockname())


def test_rcvbuf_doubled(rds_socket_factory):
    s = rds_socket_factory()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 8192


def test_sendto_port_without_listener(rds_pair, rds_observe):
    """RDS is connectionless toward ports: a message to an unbound port succeeds at send and is dropped
    (recv_drop_no_sock); the sender's later messages to a live port still arrive."""
    a, b = rds_pair
    bport = b.getsockname()[1]
    free = 2 + (bport + 7919) % 60000
    before = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    a.sendto(b"real1", b.getsockname())
    assert b.recv(10) == b"real1"
    assert a.sendto(b"void", ("127.0.0.1", free)) == 4
    a.sendto(b"real2", b.getsockname())
    got = []
    try:
        got.append(b.recv(10))
    except TimeoutError:
        got.append("timeout")
    after = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    rds_observe("after_void", got)
    assert after["recv_drop_no_sock"] > before["recv_drop_no_sock"]
    assert got == [b"real2"]
