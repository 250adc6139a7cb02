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

from pyrds.userspace.proto import CongestionMap, PathEngine
from pyrds.userspace.stack.sockstate import Incoming, Outgoing
from pyrds.userspace.transports.tcp.path import R, TcpPath
from tests.unit.userspace.fakes import FakeSvc

LADDR, FADDR = ipaddress.ip_address("10.0.0.2"), ipaddress.ip_address("10.0.0.1")


class FakeStack:
    """The StackHost a path talks to."""

    def __init__(self) -> None:
        sysctl = {"ping_enable": 1, "rds_tcp_sndbuf": 0, "rds_tcp_rcvbuf": 0}
        self.config = type("Cfg", (), {"sysctl": sysctl})
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.delivered: list[bytes] = []

    def deliver(self, inc: Incoming) -> None:
        self.delivered.append(inc.payload)

    def acked(self, _msg: Outgoing) -> None: ...
    def is_local(self, *_a: Any) -> bool:
        return False

    def local_cong_map(self, _addr: Any) -> CongestionMap:
        return CongestionMap()

    def peer_cong_map(self, *_a: Any) -> None: ...
    def cong_updated(self, *_a: Any) -> None: ...


class FakeConn:
    owner = False
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


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as lst:
        peer = socket.create_connection(lst.getsockname())
        ours, _ = lst.accept()
    ours.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()


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
