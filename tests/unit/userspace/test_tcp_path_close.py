"""TcpPath over a real loopback TCP connection with a fake event loop: bytes the peer's TCP already acked are
delivered even when the connection is reset, and a deliberate reset is a FIN that keeps reading."""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from pyrds.userspace.config import SYSCTL_DEFAULTS
from pyrds.userspace.proto import CongestionMap, MessageReceived, PathEngine
from pyrds.userspace.stack.sockstate import Incoming, Outgoing
from pyrds.userspace.transports.tcp.path import ACK_POLL, ACK_POLL_IDLE, R, TcpPath
from pyrds.userspace.transports.tcp.sockopt import unread_bytes
from tests.unit.userspace.fakes import FakeSvc

LADDR, FADDR = ipaddress.ip_address("10.0.0.2"), ipaddress.ip_address("10.0.0.1")


class FakeStack:
    """The StackHost a path talks to."""

    def __init__(self) -> None:
        sysctl = dict(SYSCTL_DEFAULTS)
        self.config = type("Cfg", (), {"sysctl": sysctl})
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.delivered: list[bytes] = []
        self.pushable: list[bool] = []

    def deliver(self, inc: Incoming) -> bool:
        self.delivered.append(inc.payload)
        self.pushable.append(inc.pushable)
        return True

    def hold_reader(self, *_a: Any) -> bool:
        return False

    def acked(self, _msg: Outgoing) -> None: ...
    def acks_awaited(self, _msg: Outgoing) -> bool:
        return True

    def is_local(self, *_a: Any) -> bool:
        return False

    def local_cong_map(self, _addr: Any) -> CongestionMap:
        return CongestionMap()

    def peer_cong_map(self, *_a: Any) -> None: ...
    def cong_updated(self, *_a: Any) -> None: ...


class FakeConn:
    owner = False
    rx_page = None  # no page: the ACK-before-push rule
    closed = False
    laddr, faddr = LADDR, FADDR

    def __init__(self) -> None:
        self.mgr = type("Mgr", (), {"stack": FakeStack(), "svc": FakeSvc()})()
        self.host = self.mgr.stack  # the path's StackHost and event loop
        self.loop = self.mgr.svc
        self.downs = 0
        self.paths: list[TcpPath] = []
        self.paths.append(TcpPath(self, 0))  # type: ignore[arg-type]  # path 0: what paths > 0 catch up with

    def path_down(self, _p: TcpPath) -> None:
        self.downs += 1

    def path0_up(self) -> None: ...
    def path_confirmed(self, _p: TcpPath) -> None: ...
    def negotiated(self, _n: int) -> None: ...
    def doorbell(self) -> None: ...
    def advance(self) -> None: ...

    def dials_now(self) -> list[int]:
        return [p.index for p in self.paths if p.sock is None]  # any path without a connection may dial


def peer_frames(*payloads: bytes) -> bytes:
    eng = PathEngine(FADDR, LADDR, 1)
    eng.connection_made(0.0)
    for p in payloads:
        eng.queue(4000, 5000, p)
    return eng.bytes_to_send()


def run_until_closed(path: TcpPath) -> None:
    deadline = time.monotonic() + 5
    while path.sock is not None and time.monotonic() < deadline:
        path._on_io(R)
        time.sleep(0.001)


def test_peer_reset_while_we_send_still_delivers_what_it_sent(tcp_pair: tuple[socket.socket, ...]) -> None:
    ours, peer = tcp_pair
    conn = FakeConn()
    path = TcpPath(conn, 1)  # type: ignore[arg-type]
    path.established(ours)
    peer.sendall(peer_frames(b"one", b"two"))  # acked by our TCP, not read yet
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # RST
    time.sleep(0.05)
    path.queue(Outgoing(0, LADDR, FADDR, 0, 4000, b"pong"))  # the send fails: ECONNRESET/EPIPE
    run_until_closed(path)
    assert conn.mgr.stack.delivered == [b"one", b"two"]
    assert path.sock is None and conn.downs == 1


def test_deliberate_close_is_a_fin_and_reads_until_the_peers_fin(tcp_pair: tuple[socket.socket, ...]) -> None:
    ours, peer = tcp_pair
    conn = FakeConn()
    path = TcpPath(conn, 1)  # type: ignore[arg-type]
    path.established(ours)
    path.begin_close()
    peer.settimeout(5)
    got = b""
    while chunk := peer.recv(65536):  # our cong map, then EOF: a FIN, not a reset
        got += chunk
    assert len(got) == 48 + 8192
    peer.sendall(peer_frames(b"late"))  # still read and delivered
    peer.shutdown(socket.SHUT_WR)
    run_until_closed(path)
    assert conn.mgr.stack.delivered == [b"late"]
    assert path.sock is None


class DialingConn(FakeConn):
    """An owner on 127.0.0.1 that dials ``port``; records the messages the path reports acked."""

    owner = True
    laddr = faddr = ipaddress.ip_address("127.0.0.1")

    def __init__(self, port: int) -> None:
        super().__init__()
        self.host.config.tcp_peer_port = port
        self.acked: list[bytes] = []
        self.host.acked = lambda msg: self.acked.append(msg.payload)  # type: ignore[method-assign]

    def new_socket(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        return s


def test_reset_while_the_connect_event_is_pending_still_reads_what_the_peer_sent() -> None:
    """A path whose TCP handshake completed before the event loop handled its connect event is dropped (a
    sysctl rewrite, another path lost): what the peer already sent on it was acked by our TCP, and a 7.x
    kernel freed it on that ack, so it must be read and delivered, with a FIN, not discarded with a reset."""
    with socket.create_server(("127.0.0.1", 0)) as lst:
        conn = DialingConn(lst.getsockname()[1])
        path = conn.paths[0]
        path._dial()  # connect event registered with the fake loop, never handled
        peer, _ = lst.accept()
        with peer:
            peer.sendall(peer_frames(b"early", b"bird"))
            time.sleep(0.05)  # acked by our TCP, unread
            path.begin_close()
            peer.settimeout(5)
            got = b""
            while chunk := peer.recv(65536):  # ECONNRESET here when the path threw the bytes away
                got += chunk
            peer.shutdown(socket.SHUT_WR)
            run_until_closed(path)
    assert conn.host.delivered == [b"early", b"bird"]
    assert conn.host.counters["tcp_close_unread"] == 0
    assert path.sock is None


def test_a_dialling_socket_acks_nothing_of_the_last_connection() -> None:
    """Messages in flight when a connection died stay unacked (they are retransmitted on the next one): the
    new, still dialling socket's SIOCOUTQ (0) must not be read as "the peer acked all written before"."""
    with socket.create_server(("127.0.0.1", 0)) as lst:
        conn = DialingConn(lst.getsockname()[1])
        path = conn.paths[0]
        with socket.socket() as old_peer:
            old_peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            old_peer.bind(("127.0.0.1", 0))
            old_peer.listen(1)
            ours = socket.create_connection(old_peer.getsockname())
            ours.setblocking(False)
            peer, _ = old_peer.accept()
            path.established(ours)
            path.confirmed = True
            for i in range(64):  # far more than the peer's window: most stays unacked in our send queue
                path.queue(Outgoing(1, conn.laddr, conn.faddr, 4000, 5000, bytes([i]) * 60000))
            assert path.engine.unacked, "nothing in flight: the test cannot tell"
            in_flight = len(path.engine.unacked)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()  # RST: the connection dies with messages unacked
            run_until_closed(path)
        assert path.sock is None
        acked_before = len(conn.acked)
        path._dial()  # the re-dial, its connect event not handled yet
        lst.accept()[0].close()
        path.check_acks()  # the ack timer, a flush for a congestion map change
        path.begin_close()  # a sysctl rewrite while dialling
        assert len(conn.acked) == acked_before, "messages of the dead connection reported acked"
        assert len(path.engine.unacked) == in_flight - acked_before


@pytest.fixture
def closed_window_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Ours and a peer that never reads with a tiny receive buffer: what we write beyond it stays unacked."""
    with socket.create_server(("127.0.0.1", 0)) as lst:
        peer = socket.socket()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        peer.connect(lst.getsockname())
        ours, _ = lst.accept()
    ours.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()


def _ack_timers(conn: FakeConn) -> list[float]:
    return [delay for delay, _fn in conn.loop.timers]


def test_unacked_messages_are_asked_about_soon_only_when_a_sender_waits(
    closed_window_pair: tuple[socket.socket, ...],
) -> None:
    ours, _peer = closed_window_pair
    conn = FakeConn()
    awaited = False
    conn.host.acks_awaited = lambda _msg: awaited  # type: ignore[method-assign]
    path = TcpPath(conn, 1)  # type: ignore[arg-type]
    path.established(ours)
    conn.loop.timers.clear()
    for _ in range(3):
        path.queue(Outgoing(7, LADDR, FADDR, 4000, 5000, bytes(65536)))
    assert path.pending  # the peer's window is closed: not acked
    # nobody waits for these acks: one timer, not soon (every read and write of the path asks anyway)
    assert _ack_timers(conn) == [ACK_POLL_IDLE]
    awaited = True  # e.g. the sender's buffer is half full now: a sooner timer is added
    path.queue(Outgoing(7, LADDR, FADDR, 4000, 5000, bytes(65536)))
    assert _ack_timers(conn) == [ACK_POLL_IDLE, ACK_POLL]
    soon = conn.loop.timers.pop()[1]
    time.sleep(ACK_POLL)  # its time comes (the fake loop runs timers when told, not when due)
    soon()  # still unacked: the next one, soon again
    assert _ack_timers(conn) == [ACK_POLL_IDLE, ACK_POLL]
    late = conn.loop.timers.pop(0)[1]
    late()  # superseded by the sooner ones: does nothing, adds nothing
    assert _ack_timers(conn) == [ACK_POLL]


def test_a_read_with_more_than_an_mss_waiting_behind_it_is_acked_and_pushable() -> None:
    """A bulk sender keeps our receive queue full, so it is never empty after a read; yet with at least the
    advertised MSS still queued, TCP_QUICKACK acks past what we read (tcp_cleanup_rbuf's once-per-MSS rule),
    so the messages may be pushed to the reader (before: served by request, one round trip each)."""
    with socket.create_server(("127.0.0.1", 0)) as lst:
        lst.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE: the whole stream fits (root)
        peer = socket.create_connection(lst.getsockname())
        ours, _ = lst.accept()
    try:
        ours.setblocking(False)
        stream = peer_frames(*[bytes([i]) * 16384 for i in range(128)])
        peer.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 10
        while sent < len(stream) and time.monotonic() < deadline:
            try:
                sent += peer.send(stream[sent:])
            except BlockingIOError:
                time.sleep(0.001)
        assert sent == len(stream)
        while unread_bytes(ours) < len(stream) and time.monotonic() < deadline:
            time.sleep(0.001)
        conn = FakeConn()
        path = TcpPath(conn, 1)  # type: ignore[arg-type]
        path.established(ours)
        assert 0 < path._advmss <= 0xFFFF
        path._on_io(R)  # one read of 256 KiB (plus the ones the ACK rule makes): MiBs still queued behind it
        assert unread_bytes(ours) >= path._advmss
        got = conn.mgr.stack.pushable
        assert got and all(got)
    finally:
        ours.close()
        peer.close()


def test_cancel_takes_a_message_out_of_the_engine_not_only_the_staging_queue() -> None:
    """``rds_send_drop_to``: a message the engine holds and TCP never got is not written; one written and
    unacked is not written again after a reconnect; the others go out as before."""
    conn = FakeConn()
    path = conn.paths[0]
    path.engine.connection_made(time.monotonic())  # up, no socket: queue() hands messages to the engine
    msgs = [Outgoing(1, LADDR, FADDR, 4000, 5000, bytes([65 + i]) * 8) for i in range(4)]
    path.queue(msgs[0], kick=False)
    path.engine.buffers_to_send()  # msgs[0] written (TCP took it), not acked
    for m in msgs[1:]:
        path.queue(m, kick=False)
    assert not path.staged and path.engine.queued_msgs == 4
    path.cancel_many([msgs[0]])
    path.cancel_many([msgs[2]])
    assert path.engine.queued_msgs == 2 and path.engine.queued_bytes == 16
    assert [r.seq for r in path.engine.unsent] == [msgs[1].seq, msgs[3].seq] and path.engine.unacked == []
    path.engine.connection_lost(time.monotonic())
    path.engine.connection_made(time.monotonic())
    peer = PathEngine(FADDR, LADDR)
    peer.connection_made(time.monotonic())
    events = peer.feed(path.engine.bytes_to_send(), time.monotonic())
    got = [e.payload for e in events if isinstance(e, MessageReceived)]
    assert got == [b"B" * 8, b"D" * 8]
