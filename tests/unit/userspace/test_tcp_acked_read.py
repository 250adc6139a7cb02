"""A path acks everything it read before any of it reaches a reader (docs/userspace.md, "Restart").

TCP_QUICKACK sends the delayed ACK only when the read left the receive queue empty; bytes that arrived after
the read kept it delayed, and a service killed in that window had the peer resend messages it had already
delivered (duplicates after a restart, seen under load in ``test_restart_netns[receiver]``). So a read goes
on until the queue is empty: checked here on a real loopback TCP pair, where the first ``recv`` takes only
part of what is queued."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from pyrds.userspace.transports.tcp import path as tcp_path
from pyrds.userspace.transports.tcp.sockopt import unacked_bytes, unread_bytes


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    lst = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()
    lst.close()
    a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _queued(s: socket.socket, n: int) -> None:
    deadline = time.monotonic() + 5
    while unread_bytes(s) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert unread_bytes(s) >= n


def test_a_read_takes_what_arrived_after_it_until_the_queue_is_empty(pair) -> None:
    peer, ours = pair
    for i in range(3):
        peer.send(b"%d" % i * 1000)
    _queued(ours, 3000)
    first = ours.recv(1000)
    assert unread_bytes(ours) == 2000  # left behind: TCP_QUICKACK alone would keep the ACK delayed
    data, acked = tcp_path._acked_read(ours, first)
    assert data == b"0" * 1000 + b"1" * 1000 + b"2" * 1000
    assert acked
    assert unread_bytes(ours) == 0
    deadline = time.monotonic() + 5  # and the peer's TCP got the ACK for all of it
    while unacked_bytes(peer) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert unacked_bytes(peer) == 0


def test_a_read_stops_at_the_peers_fin_and_leaves_it_for_the_next_read(pair) -> None:
    peer, ours = pair
    peer.send(b"x" * 100)
    peer.shutdown(socket.SHUT_WR)
    _queued(ours, 100)
    first = ours.recv(10)
    assert tcp_path._acked_read(ours, first)[0] == b"x" * 100
    assert ours.recv(10, socket.MSG_DONTWAIT) == b""  # the FIN is still there to be seen


def test_a_read_makes_a_bounded_number_of_extra_reads(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    peer, ours = pair
    monkeypatch.setattr(tcp_path, "WRITE_CHUNK", 10)
    peer.send(b"y" * 200)
    _queued(ours, 200)
    first = ours.recv(10)
    data, acked = tcp_path._acked_read(ours, first)
    assert len(data) == 10 + 10 * tcp_path.ACK_READS  # a queue refilled forever cannot hold the path here
    assert not acked  # bytes left unread: the ACK for the last ones may still be delayed (not pushed)
