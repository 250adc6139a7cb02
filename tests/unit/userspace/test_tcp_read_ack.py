"""RDS/TCP messages of a read that was not known acked when it was fed (``_acked_read`` said False) are pushed
to their reader once a later read of the same connection is acked (TCP's ACK is cumulative), instead of each
being served by request; never before, never across connections, and always in order."""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import Any

import pytest

from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.sockstate import Incoming, ReadAck
from pyrds.userspace.transports.tcp import path as tcp_path
from pyrds.userspace.transports.tcp.path import R, TcpPath
from pyrds.userspace.transports.tcp.sockopt import segments_out
from tests.unit.userspace.fakes import PageSink as Sink
from tests.unit.userspace.test_tcp_path_close import LADDR, FakeConn, peer_frames

LOCAL = ipaddress.ip_address("127.0.0.1")
PEER = ipaddress.ip_address("10.9.9.9")


def _receiver() -> tuple[Stack, Sink, int]:
    stack = Stack()
    rs = stack.open()
    stack.bind(rs, LOCAL, 0, 0)
    sink = Sink()
    rs.push = sink
    return stack, sink, rs.bound_port


def _inc(port: int, payload: bytes, read_ack: ReadAck | None) -> Incoming:
    return Incoming(PEER, LOCAL, 4000, port, payload, pushable=read_ack is None, read_ack=read_ack)


def test_a_message_waits_for_its_reads_ack_and_holds_the_later_ones_behind_it() -> None:
    stack, sink, port = _receiver()
    first = ReadAck()
    stack.deliver(_inc(port, b"a", first))
    stack.deliver(_inc(port, b"b", first))
    stack.deliver(_inc(port, b"c", None))  # an acked read: pushable, but not before a and b
    assert sink.pushed == []
    stack.push_acked(LOCAL, port)
    assert sink.pushed == [], "pushed before its read was acked"
    first.acked = True
    stack.push_acked(LOCAL, port)
    assert sink.pushed == [b"a", b"b", b"c"]
    assert stack.counters["recv_pushed"] == 3


def test_a_message_with_an_rdma_cookie_is_never_pushed_even_when_its_read_is_acked() -> None:
    stack, sink, port = _receiver()
    ack = ReadAck()
    inc = _inc(port, b"r", ack)
    inc.rdma_cookie = 1 | 2 << 32
    stack.deliver(inc)
    ack.acked = True
    stack.push_acked(LOCAL, port)
    assert sink.pushed == []


class Host:
    """Records what a path delivers and the pushes it asks for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.incs: list[Incoming] = []
        self.pushes: list[tuple[Any, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def deliver(self, inc: Incoming) -> bool:
        self.incs.append(inc)
        return True

    def push_acked(self, daddr: Any, dport: int) -> None:
        self.pushes.append((daddr, dport))


def _path(
    sock: socket.socket, acks: list[bool], monkeypatch: pytest.MonkeyPatch, segs: list[int] | None = None
) -> tuple[TcpPath, Host]:
    """A path on ``sock`` whose reads are acked or not as ``acks`` says, one after the other, and whose
    tcpi_segs_out reads as ``segs`` says one after the other (default: never moves)."""
    conn = FakeConn()
    host = Host(conn.host)
    conn.host = host
    path = TcpPath(conn, 1)  # type: ignore[arg-type]
    path.established(sock)
    answers = iter(acks)
    monkeypatch.setattr(tcp_path, "_acked_read", lambda s, data, advmss=0: (data, next(answers)))
    counts = iter(segs or [])
    monkeypatch.setattr(tcp_path, "segments_out", lambda s: next(counts, 7) if segs else 7)
    return path, host


def _arrive(path: TcpPath, peer: socket.socket, data: bytes) -> None:
    peer.sendall(data)
    time.sleep(0.02)
    path._on_io(R)


def test_an_acked_read_lets_the_messages_of_earlier_reads_be_pushed(
    tcp_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, peer = tcp_pair
    path, host = _path(ours, [False, False, True], monkeypatch)
    stream = peer_frames(b"one", b"two", b"three")
    cut1, cut2 = 48 + 3, 2 * 48 + 6  # one whole message per read
    _arrive(path, peer, stream[:cut1])
    _arrive(path, peer, stream[cut1:cut2])
    first, second = host.incs
    assert not first.pushable and not second.pushable
    assert first.read_ack is not None and second.read_ack is not None
    assert first.read_ack is not second.read_ack
    assert not first.read_ack.acked and not second.read_ack.acked
    assert host.pushes == []
    _arrive(path, peer, stream[cut2:])
    third = host.incs[2]
    assert third.pushable and third.read_ack is None
    assert first.read_ack.acked and second.read_ack.acked
    assert host.pushes == [(LADDR, 5000)]


def test_a_new_connection_forgets_the_reads_of_the_last_one(
    tcp_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, peer = tcp_pair
    path, host = _path(ours, [False, True], monkeypatch)
    _arrive(path, peer, peer_frames(b"old"))
    old = host.incs[0]
    assert old.read_ack is not None
    with socket.create_server(("127.0.0.1", 0)) as lst:
        peer2 = socket.create_connection(lst.getsockname())
        ours2, _ = lst.accept()
    try:
        ours2.setblocking(False)
        path.lost()
        path.established(ours2)
        _arrive(path, peer2, peer_frames(b"new"))
        assert host.incs[1].pushable
        assert not old.read_ack.acked, "an ACK on the new connection says nothing about the old one"
        assert host.pushes == []
    finally:
        ours2.close()
        peer2.close()


def test_the_reads_a_path_remembers_are_bounded(
    tcp_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, peer = tcp_pair
    n = tcp_path.MAX_ACK_WAITS + 5
    path, host = _path(ours, [False] * n + [True], monkeypatch)
    stream = peer_frames(*[b"%03d" % i for i in range(n + 1)])
    size = 48 + 3
    for i in range(n + 1):
        _arrive(path, peer, stream[i * size : (i + 1) * size])
    assert len(host.incs) == n + 1
    acked = [inc.read_ack.acked for inc in host.incs[:n] if inc.read_ack is not None]
    assert acked == [False] * 5 + [True] * tcp_path.MAX_ACK_WAITS  # the oldest forgotten: by request
    assert len(path._ack_waits) == 0


def test_a_segment_tcp_sent_after_a_read_acks_it(
    tcp_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No read is acked by _acked_read's rules, but tcpi_segs_out moved after the first (an ACK went out,
    which acks everything received before it): the first read's messages may be pushed, not the second's."""
    ours, peer = tcp_pair
    path, host = _path(ours, [False, False, False], monkeypatch, segs=[10, 10, 11])
    stream = peer_frames(b"one", b"two", b"three")
    cut1, cut2 = 48 + 3, 2 * 48 + 6
    _arrive(path, peer, stream[:cut1])  # segs 10 after it
    _arrive(path, peer, stream[cut1:cut2])  # still 10: nothing sent since the first read
    first, second = host.incs
    assert first.read_ack is not None and not first.read_ack.acked
    assert host.pushes == []
    _arrive(path, peer, stream[cut2:])  # 11: a segment went out after the second read
    third = host.incs[2]
    assert first.read_ack.acked and second.read_ack is not None and second.read_ack.acked
    assert third.read_ack is not None and not third.read_ack.acked
    assert host.pushes == [(LADDR, 5000)]


def test_tcp_counts_a_pure_ack_in_segs_out(tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    """What the rule above relies on, asked of the running kernel: an ACK without data counts in
    tcpi_segs_out (a new connection acks its first data at once: quickack mode)."""
    ours, peer = tcp_pair
    before = segments_out(ours)
    assert before is not None
    peer.sendall(b"x" * 100)
    deadline = time.monotonic() + 5
    while segments_out(ours) == before and time.monotonic() < deadline:
        time.sleep(0.005)
    assert segments_out(ours) == before + 1  # we sent no data: that was the ACK
