"""RDS/TCP multipath toward 7.x kernels, on TcpConn/TcpPath with a fake event loop and real loopback TCP
connections: SPORT_IDX pairing by ``sport % npaths``, the 6.1 rules for peers without it, the fan-out check,
re-probing, the path 0 catch-up with its counter, the dialer's source ports, SO_RDS_TRANSPORT in a netns."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrds.constants import RDS_CONG_MAP_BYTES, SOL_RDS, ExtHeaderType, SockOpt
from pyrds.userspace.config import StackConfig
from pyrds.userspace.proto import (
    ExtHeader,
    MessageReceived,
    NpathsNegotiated,
    PathEngine,
    PongReceived,
    RDSHeader,
)
from pyrds.userspace.proto.pathset import OWNER_PREAMBLE, PORT_TAG, Lane, dial_port, fan_out_dials, is_tagged
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.counters import info_counters
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.sockopts import getsockopt, setsockopt
from pyrds.userspace.stack.sockstate import Outgoing
from pyrds.userspace.transports import loop_transport
from pyrds.userspace.transports.tcp import conn as tcp_conn
from pyrds.userspace.transports.tcp import path as tcp_path
from pyrds.userspace.transports.tcp import rxseq
from pyrds.userspace.transports.tcp import sockopt as tcp_sockopt
from pyrds.userspace.transports.tcp.conn import TcpConn
from pyrds.userspace.transports.tcp.transport import TcpTransport
from tests.unit.userspace.fakes import FakeSvc

SMALL, LARGE = ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("10.0.0.2")
# 7.x rds_send_probe on the wire: NPATHS 8, GEN_NUM 77, SPORT_IDX
PROBE_7X = RDSHeader(sequence=1, sport=1, dport=0).encode()[:32] + bytes(
    [5, 0, 8, 6, 0, 0, 0, 77, 8, 0]
).ljust(16, b"\0")
PROBE_61 = RDSHeader(sequence=1, sport=1, dport=0, exthdr=(ExtHeader.npaths(8),)).encode()


@pytest.fixture
def peers() -> Iterator[list[socket.socket]]:
    """The dialer ends of the connections a test makes (closed afterwards)."""
    made: list[socket.socket] = []
    yield made
    for s in made:
        s.close()


def _free_port(pick: Callable[[], int]) -> int:
    """The first port ``pick()`` gives (0: skip it) that is free on 127.0.0.1."""
    while True:
        port = pick()
        if not port:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def kernel_port(index: int) -> int:
    """A 7.x dialer's source port for path ``index`` (ALIGN(low, 8) + group * 8 + index) that is NOT a pyrds
    tag, free on 127.0.0.1."""

    def pick() -> int:
        port = 32768 + random.randrange(3000) * 8 + index
        return 0 if is_tagged(port) else port

    return _free_port(pick)


def connect_from(port: int, peers: list[socket.socket]) -> socket.socket:
    """A TCP connection from 127.0.0.1:``port``; returns our (accepted, non-blocking) end."""
    with socket.create_server(("127.0.0.1", 0)) as lst:
        dialer = socket.socket()
        dialer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        dialer.bind(("127.0.0.1", port))
        dialer.connect(lst.getsockname())
        ours, _ = lst.accept()
    dialer.settimeout(5)
    peers.append(dialer)
    ours.setblocking(False)
    return ours


def make_conn_and_transport(owner: bool) -> tuple[TcpConn, FakeSvc, Stack, TcpTransport]:
    """A connection of a TCP transport that is not attached to its stack (the stack sends nothing to it)."""
    stack = Stack()
    svc = FakeSvc()
    stack.attach(loop_transport(stack))
    mgr = TcpTransport(stack, svc)
    conn = mgr.conn(SMALL, LARGE) if owner else mgr.conn(LARGE, SMALL)
    assert conn.owner == owner
    return conn, svc, stack, mgr


def make_conn(owner: bool) -> tuple[TcpConn, FakeSvc, Stack]:
    conn, svc, stack, _tcp = make_conn_and_transport(owner)
    return conn, svc, stack


def arrive(path: Any, dialer: socket.socket, data: bytes) -> None:
    """The peer writes ``data`` on ``path``'s connection; the event loop reads it (and flushes replies)."""
    dialer.sendall(data)
    time.sleep(0.02)
    path._on_io(tcp_path.R)


def read_frames(dialer: socket.socket, want: int) -> list[RDSHeader]:
    """What our side wrote on the connection as the peer's PathEngine parses it (at least ``want`` frames)."""
    eng = PathEngine(SMALL, LARGE, 0, ping_enable=False)
    eng.connection_made(0.0)
    eng.bytes_to_send()
    headers: list[RDSHeader] = []
    deadline = time.monotonic() + 5
    while len(headers) < want and time.monotonic() < deadline:
        for frame in eng.framer.feed(dialer.recv(65536)):
            headers.append(frame[0])
    return headers


def test_7x_dialer_paths_pair_by_source_port_once_its_probe_says_sport_idx(
    peers: list[socket.socket],
) -> None:
    conn, _svc, _stack = make_conn(owner=False)
    port0 = kernel_port(0)
    conn.accept(connect_from(port0, peers), port0)
    assert conn.max_paths == 1  # an untagged path 0 before any handshake: the 6.1 rule, as before
    p0 = conn.paths[0]
    arrive(p0, peers[0], PROBE_7X)
    assert conn.with_sport_idx and conn.npaths == 8 and len(conn.paths) == 8
    frames = [h for h in read_frames(peers[0], 2) if h.flags != 1]  # skip our congestion map
    pong = frames[0]
    assert (pong.sport, pong.dport) == (0, 1)
    assert pong.exthdr == (ExtHeader.npaths(8), ExtHeader.sport_idx())  # every path, and SPORT_IDX
    lane_ports = {}
    for index in random.sample(range(1, 8), 7):  # 7.x dials paths 1..7 in parallel: any arrival order
        port = kernel_port(index)
        lane_ports[index] = port
        conn.accept(connect_from(port, peers), port)
    for index, port in lane_ports.items():
        assert conn.paths[index].peer_port == port
    assert conn.paths[0].peer_port == port0


def message(index: int, sport: int, payload: bytes, seq: int = 1) -> bytes:
    """One RDS/TCP message as a peer's path ``index`` writes it (sequence ``seq``)."""
    eng = PathEngine(SMALL, LARGE, index)
    eng.connection_made(0.0)
    for _ in range(seq - 1):
        eng.queue(sport, 5000, b"")
    eng.bytes_to_send()
    eng.queue(sport, 5000, payload)
    return eng.bytes_to_send()


def poll_path(path: Any, until: Any, timeout: float = 5.0) -> bool:
    """The event loop for one path: read its socket while ``until()`` is false (FakeSvc polls nothing)."""
    import select

    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        s = path.sock
        if s is not None and select.select([s], [], [], 0.05)[0]:
            path._on_io(tcp_path.R)
        else:
            time.sleep(0.02)
    return bool(until())


def test_redial_of_a_busy_path_waits_until_the_old_connection_is_gone(peers: list[socket.socket]) -> None:
    """The peer re-dials path 3 before our side read the old connection's end: the new connection waits
    (7.x stashes it), the old one is read to its FIN (its message, acked by our TCP, is delivered), then
    the new one gets the path."""
    conn, _svc, stack = make_conn(owner=False)
    port0 = kernel_port(0)
    conn.accept(connect_from(port0, peers), port0)
    conn.paths[0]._feed(PROBE_7X)
    old_port = kernel_port(3)
    conn.accept(connect_from(old_port, peers), old_port)
    old_dialer = peers[-1]
    old_dialer.sendall(message(3, 4000, b"acked by our TCP, never read"))
    old_dialer.shutdown(socket.SHUT_WR)  # the peer dropped the old connection ...
    time.sleep(0.05)
    new_port = kernel_port(3)
    conn.accept(connect_from(new_port, peers), new_port)  # ... and re-dialled before we read its FIN
    assert conn.paths[3].peer_port == old_port and len(conn.waiting) == 1
    assert stack.counters["tcp_accept_deferred"] == 1
    assert poll_path(conn.paths[3], lambda: conn.paths[3].peer_port == new_port)
    assert stack.counters["recv_drop_no_sock"] == 1  # the old connection's message was read and delivered
    assert not conn.waiting
    while old_dialer.recv(65536):  # our congestion map, then EOF: the old connection is closed
        pass
    assert stack.counters["tcp_connect_raced"] == 0


@pytest.mark.parametrize("sport_idx", [True, False])
def test_a_second_connection_for_a_live_path_neither_replaces_it_nor_delivers(
    peers: list[socket.socket], sport_idx: bool
) -> None:
    """Issue 8: anyone on the peer's host can dial from a port shaped like a path (``port % 8 == i``, or a
    pyrds tag). No kernel lets such a connection take a path that is up (``rds_tcp_accept_one_path`` only
    claims RDS_CONN_DOWN paths), so neither does the stack: the live path keeps its connection and carries
    on, what the newcomer writes is not read, and once the live connection proved alive after the newcomer
    arrived (its keepalive probe acked), the newcomer is refused as 6.1 refuses it; nothing of it is ever
    delivered, not even when the live path goes down later."""
    from pyrds.userspace.transports.tcp.conn import MAX_WAITING, PROOF_DELAY

    conn, svc, stack = make_conn(owner=False)
    port0 = kernel_port(0) if sport_idx else tagged_port(0)
    conn.accept(connect_from(port0, peers), port0)
    genuine = peers[-1]
    index = 3 if sport_idx else 0
    conn.paths[0]._feed(PROBE_7X if sport_idx else PROBE_61)
    assert conn.npaths == 8 and conn.with_sport_idx == sport_idx
    if sport_idx:
        port = kernel_port(3)
        conn.accept(connect_from(port, peers), port)
        genuine = peers[-1]
    live = conn.paths[index]
    live_port = live.peer_port

    def shaped() -> int:
        return kernel_port(index) if sport_idx else tagged_port(0)

    forged_port = shaped()
    conn.accept(connect_from(forged_port, peers), forged_port)
    forger = peers[-1]
    forger.sendall(message(index, 4444, b"forged", seq=1000))
    time.sleep(0.05)
    assert live.peer_port == live_port and live.sock is not None and not live.closing
    assert stack.counters["recv_drop_no_sock"] == 0  # nothing of the forger's was read
    genuine.sendall(message(index, 4000, b"genuine"))
    assert poll_path(live, lambda: stack.counters["recv_drop_no_sock"] == 1)
    assert live.peer_port == live_port and len(conn.waiting) == 1
    # more than MAX_WAITING hopefuls: the rest is refused at once, like a full accept backlog
    for _ in range(MAX_WAITING):
        extra = shaped()
        conn.accept(connect_from(extra, peers), extra)
    assert len(conn.waiting) == MAX_WAITING and stack.counters["tcp_connect_raced"] == 1
    time.sleep(PROOF_DELAY + 0.2)  # the live connection's keepalive probe (made at once) has been acked
    svc.run_timers(PROOF_DELAY)
    assert not conn.waiting and stack.counters["tcp_accept_refused_live"] == MAX_WAITING
    forger.settimeout(2)
    with contextlib.suppress(ConnectionResetError):
        assert forger.recv(65536) == b""  # refused: closed unread
    genuine.close()  # the genuine path goes down now: nothing takes it, nothing forged is read
    assert poll_path(live, lambda: live.sock is None)
    assert live.sock is None and stack.counters["recv_drop_no_sock"] == 1


def test_a_connection_the_peer_lost_silently_gives_way_within_seconds(peers: list[socket.socket]) -> None:
    """The peer lost path 0's connection without a FIN or RST reaching us (a reboot, a lost RST): a new
    connection for the path makes the old one's keepalive probe happen at once; the peer's reset answers
    it and the waiting connection takes the path (keepalive alone would wait 5 s of silence first)."""
    if os.geteuid() != 0:
        pytest.skip("TCP_REPAIR (a close that sends nothing) needs CAP_NET_ADMIN")
    conn, _svc, stack = make_conn(owner=False)
    port0 = tagged_port(0)
    conn.accept(connect_from(port0, peers), port0)
    p0 = conn.paths[0]
    gone = peers.pop()
    gone.setsockopt(socket.IPPROTO_TCP, 19, 1)  # TCP_REPAIR: close() sends nothing
    gone.close()
    time.sleep(1.1)  # the old connection has been silent for a second
    new_port = port0
    while new_port == port0:  # port0 is free again (the close sent nothing): 1 tagged port in 110 repeats
        new_port = tagged_port(0)
    started = time.monotonic()
    conn.accept(connect_from(new_port, peers), new_port)
    assert p0.peer_port == port0
    old = p0.sock
    assert old is not None
    # the mechanism, checked directly (a time bound tells 1 s from 5 s badly on a busy machine): the old
    # connection's keepalive probe is due after 1 s of silence instead of rds_tcp_keepalive's 5 s
    assert old.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
    assert poll_path(p0, lambda: p0.peer_port == new_port, timeout=30.0), "the dead connection kept the path"
    print(f"the waiting connection got path 0 after {time.monotonic() - started:.2f} s")
    assert stack.counters["conn_reset"] == 1


def test_a_path_connection_carries_the_tcp_user_timeout(peers: list[socket.socket]) -> None:
    """Every RDS/TCP connection gets TCP_USER_TIMEOUT = ``rds_tcp_user_timeout_ms`` (30 s by default; 0:
    none), so one whose data goes unanswered is dropped instead of retransmitting for ~15 minutes
    (``test_tcp_silent_path`` shows the stall it ends)."""
    conn, _svc, stack = make_conn(owner=False)
    port0 = tagged_port(0)
    conn.accept(connect_from(port0, peers), port0)
    sock = conn.paths[0].sock
    assert sock is not None
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
    stack.config.set_sysctl("rds_tcp_user_timeout_ms", 0)
    conn.paths[0].lost()
    port1 = tagged_port(0)
    conn.accept(connect_from(port1, peers), port1)
    sock = conn.paths[0].sock
    assert sock is not None and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 0


def test_6_1_dialer_keeps_the_single_path_rules(peers: list[socket.socket]) -> None:
    conn, _svc, _stack = make_conn(owner=False)
    port0 = kernel_port(0)
    conn.accept(connect_from(port0, peers), port0)
    arrive(conn.paths[0], peers[0], PROBE_61)
    assert conn.npaths == 1
    pong = [h for h in read_frames(peers[0], 2) if h.flags != 1][0]
    assert pong.ext(ExtHeaderType.NPATHS) == ExtHeader.npaths(1)
    port = kernel_port(5)
    conn.accept(connect_from(port, peers), port)  # a re-dial from a random port: for path 0, once it is free
    assert conn.paths[0].peer_port == port0 and len(conn.waiting) == 1
    peers[0].close()  # 6.1 dropped the old connection (FIN)
    assert poll_path(conn.paths[0], lambda: conn.paths[0].peer_port == port)
    sock = conn.paths[0].sock
    assert sock is not None and sock.getpeername()[1] == port


def test_fan_out_drops_a_path_0_that_came_from_another_path(peers: list[socket.socket]) -> None:
    """7.x rds_tcp_fan_out_w: the peer opened a path > 0 first (it knew NPATHS from an earlier life); the
    acceptor put it on path 0 before any handshake, and drops it once SPORT_IDX and NPATHS are known. Our
    probe told the peer one path (6.1 suspicion), so the stack probes again with eight."""
    conn, _svc, _stack = make_conn(owner=False)
    port = kernel_port(3)
    conn.accept(connect_from(port, peers), port)
    p0 = conn.paths[0]
    conn.send_probe()
    assert p0.engine.last_advertised == 1
    pong = RDSHeader(sequence=1, sport=0, dport=1, exthdr=(ExtHeader.npaths(8), ExtHeader.sport_idx()))
    arrive(p0, peers[0], pong.encode())
    assert conn.npaths == 8 and p0.closing  # FIN sent, still reading until the peer's FIN
    probes = [h.ext(ExtHeaderType.NPATHS) for h in read_frames(peers[0], 3) if (h.sport, h.dport) == (1, 0)]
    assert probes == [ExtHeader.npaths(1), ExtHeader.npaths(8)]
    assert peers[0].recv(1) == b""  # then our FIN


def test_owner_probes_on_every_path_0_connection(peers: list[socket.socket]) -> None:
    conn, _svc, _stack = make_conn(owner=True)
    p0 = conn.paths[0]
    for _ in range(2):
        p0.established(connect_from(kernel_port(0), peers))
        p0.lost()
    probes = [m for m in p0.engine.unsent if (m.sport, m.dport) == (1, 0)]
    assert len(probes) == 2


def test_lane_waits_for_path_0_catch_up_and_counts_it(peers: list[socket.socket]) -> None:
    conn, svc, stack = make_conn(owner=False)
    p0 = conn.paths[0]
    p0.queue(Outgoing(0, LARGE, SMALL, 0, 7, b""))  # path 0 is down: a message from before the fan-out
    conn.negotiated(8, True)
    assert p0.engine.catchup_tx_seq == p0.engine.next_tx_seq
    port1 = kernel_port(1)
    conn.accept(connect_from(port1, peers), port1)
    lane1, dialer1 = conn.paths[1], peers[-1]
    lane1.queue(Outgoing(0, LARGE, SMALL, 4000, 5000, b"later"))
    assert stack.counters["mprds_catchup_tx0_retries"] >= 1 and lane1.engine.held
    assert lane1.engine.unsent  # held back
    port0 = kernel_port(0)
    conn.accept(connect_from(port0, peers), port0)  # path 0 comes up and sends the old message
    deadline = time.monotonic() + 5
    while p0.engine.catching_up() and time.monotonic() < deadline:
        time.sleep(0.005)
        p0.check_acks()
    assert not p0.engine.catching_up()
    svc.run_timers()  # the lane's retry
    got = read_frames(dialer1, 2)
    assert [(h.length, h.sport) for h in got] == [(RDS_CONG_MAP_BYTES, 0), (5, 4000)]
    names = [name for name, _ in info_counters(stack.counters)]
    assert names.index("mprds_catchup_tx0_retries") == names.index("send_stuck_rm") + 1


def test_peer_restart_resets_every_path(peers: list[socket.socket]) -> None:
    conn, _svc, _stack = make_conn(owner=False)
    port0 = kernel_port(0)
    conn.accept(connect_from(port0, peers), port0)
    p0 = conn.paths[0]
    p0._feed(PROBE_7X)
    lane = conn.paths[2]
    lane.engine.queue(1, 2, b"x")
    lane.engine.queue(1, 2, b"y")
    assert lane.engine.next_tx_seq == 3
    again = (
        RDSHeader(sequence=2, sport=1, dport=0).encode()[:32] + PROBE_7X[32:39] + bytes([78]) + PROBE_7X[40:]
    )
    p0._feed(again)
    assert lane.engine.next_tx_seq == 1 and p0.engine.next_rx_seq == 0


def test_dialer_source_ports_name_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyrds dials path i from a port with low byte 0xA8 | i (port % 8 == i, what a 7.x acceptor pairs by);
    when no tagged port is free it takes any port of the local range with that residue, like 7.x."""
    for index in range(8):
        with socket.socket() as s:
            tcp_sockopt.bind_path_port(s, "127.0.0.1", index)
            port = s.getsockname()[1]
            assert port & 0xFF == PORT_TAG | index and port % 8 == index
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        monkeypatch.setattr(tcp_sockopt, "dial_port", lambda _r, _i: taken)  # every tagged try collides
        for index in (0, 5):
            with socket.socket() as s:
                tcp_sockopt.bind_path_port(s, "127.0.0.1", index)
                port = s.getsockname()[1]
                assert port % 8 == index and port != taken


def test_a_redial_never_reuses_the_previous_dial_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """A path's re-dial avoids the source port of its previous dial, even when that port is free again and
    the random pick repeats (1 tagged port in 110 per path): a new connection on the old 4-tuple meets what
    the network and the peer still hold for the old one (in CI a black-holed path was re-dialled from its
    old port and stayed black-holed: 0 of 10 messages in 40 s)."""
    monkeypatch.setattr(tcp_sockopt.random, "getrandbits", lambda _bits: 7)  # every pick the same
    for index in (0, 3):
        with socket.socket() as s:
            first = tcp_sockopt.bind_path_port(s, "127.0.0.1", index)
            assert s.getsockname()[1] == first
        with socket.socket() as s:  # the first socket is closed: its port is free again
            again = tcp_sockopt.bind_path_port(s, "127.0.0.1", index, avoid=first)
            assert s.getsockname()[1] == again
        assert again != first and again % 8 == index


def test_so_rds_transport_ib_outside_the_initial_netns_is_eprototype() -> None:
    """7.3 rds_set_transport: IB/IWARP only in the initial network namespace (EPROTOTYPE elsewhere); the
    range check comes first; TCP is fine anywhere; unset reads -1."""
    for initial, want in ((False, errno.EPROTOTYPE), (True, errno.ENOPROTOOPT)):
        stack = Stack(StackConfig(initial_netns=initial))
        for t in (0, 1):
            rs = stack.open()
            with pytest.raises(StackError) as ei:
                setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, t)
            assert ei.value.code == want
            assert getsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 0) == -1
        rs = stack.open()
        with pytest.raises(StackError) as ei:
            setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 3)
        assert ei.value.code == errno.EINVAL
        setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 2)
        assert getsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, 0) == 2


_NETNS_SCRIPT = """
import errno, pyrds
from pyrds.constants import SOL_RDS, SockOpt, Transport
from pyrds.userspace.config import in_initial_netns
s = pyrds.socket("userspace")
assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == -1
for t in (Transport.IB, Transport.IWARP):
    try:
        s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, t)
    except OSError as exc:
        assert exc.errno == errno.EPROTOTYPE, exc
    else:
        raise AssertionError("accepted")
s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
print("ok", in_initial_netns(), flush=True)
"""


def test_so_rds_transport_in_a_network_namespace() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    netns = pytest.importorskip("pyrds.netns")
    from pyrds.userspace.config import in_initial_netns

    assert in_initial_netns()
    name = netns.unique_name("rdsT")
    netns.create_netns(name)
    try:
        proc = netns.popen_in_netns(
            name,
            [sys.executable, "-c", _NETNS_SCRIPT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.split() == ["ok", "False"]
    finally:
        for pid in netns.netns_pids(name):
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
        netns.delete_netns(name)


def test_messages_of_the_7x_probe_are_not_delivered() -> None:
    """The probe and its pong are handshake, not data (regression guard for the extra extensions)."""
    b = PathEngine(LARGE, SMALL)
    b.connection_made(0.0)
    ev = b.feed(PROBE_7X, 1.0)
    assert not [e for e in ev if isinstance(e, MessageReceived)]
    assert [e.npaths for e in ev if isinstance(e, NpathsNegotiated)] == [8]
    a = PathEngine(SMALL, LARGE)
    a.connection_made(0.0)
    a.bytes_to_send()
    b.bytes_to_send()
    a.send_probe()
    b.feed(a.bytes_to_send(), 2.0)
    assert PongReceived(1) in a.feed(b.bytes_to_send(), 3.0)


def test_a_local_map_change_goes_out_on_every_live_path(peers: list[socket.socket]) -> None:
    """Each path carried the map as it was at its connect; a change is written on all of them, so the newest
    map is the last one on every path whatever order the peer reads its paths in (a connect-time map delayed
    on path k must not undo path 0's newer one)."""
    conn, _svc, stack, tcp = make_conn_and_transport(owner=False)
    port0 = kernel_port(0)
    conn.accept(connect_from(port0, peers), port0)
    arrive(conn.paths[0], peers[0], PROBE_7X)
    for index in range(1, 8):
        port = kernel_port(index)
        conn.accept(connect_from(port, peers), port)
    dialers = {index: peers[index] for index in range(8)}
    for index, dialer in dialers.items():  # the connect-time maps (and path 0's pong)
        want = 2 if index == 0 else 1
        assert sum(1 for h in read_frames(dialer, want) if h.flags == 1) == 1
    stack.attach(tcp)  # the stack pushes local map changes to its TCP transport
    stack.cong.set_local(LARGE, 4000, True)
    for index, dialer in dialers.items():
        frames = read_frames(dialer, 1)
        assert [h.flags for h in frames] == [1], (index, frames)
        assert frames[0].length == RDS_CONG_MAP_BYTES


def tagged_port(index: int) -> int:
    """A pyrds dialer's source port for path ``index`` (:func:`dial_port`), free on 127.0.0.1."""
    return _free_port(lambda: dial_port(random.getrandbits(16), index))


def test_path_1_accepted_before_path_0_was_read_waits_for_the_probe(peers: list[socket.socket]) -> None:
    """A restarted acceptor, slow to serve its listener, finds the owner's path 1 connection ready while the
    probe (NPATHS, SPORT_IDX) the owner wrote on path 0 before dialling it is still unread: path 0 is read
    first, so path 1 pairs by its port. Before, path 1 looked like a 6.1 dialer's re-dial (a tag other than
    0 is not believed before a handshake): it replaced path 0 and limited the connection to one path."""
    conn, _svc, _stack = make_conn(owner=False)
    port0 = tagged_port(0)
    conn.accept(connect_from(port0, peers), port0)
    owner = PathEngine(SMALL, LARGE, 0)
    owner.connection_made(0.0)
    owner.send_probe()
    peers[0].sendall(OWNER_PREAMBLE + owner.bytes_to_send())
    time.sleep(0.05)  # arrived, not read: no _on_io for path 0 yet
    port1 = tagged_port(1)
    conn.accept(connect_from(port1, peers), port1)
    assert conn.max_paths > 1 and conn.npaths == 8 and conn.with_sport_idx
    assert conn.paths[0].peer_port == port0
    assert conn.paths[1].peer_port == port1


def _conn_on_page(mgr: TcpTransport) -> TcpConn:
    """A new connection to SMALL on the page the test gave the transport (not the one the transport made)."""
    return TcpConn(mgr.host, mgr.loop, LARGE, SMALL, stopped=lambda: mgr.closed, rx_page=mgr.rx_page)


def test_a_restarted_acceptor_pairs_the_owners_redial_by_port_from_the_first_connection(
    peers: list[socket.socket], tmp_path: Path
) -> None:
    """The pairing a 7.x owner's probe taught the last service is kept with the receive sequences
    (transports/tcp/rxseq.py). The owner re-dials every path at once after the reset, each from a port that
    names it, in any order: before, the new service took the first arrival for path 0 and left the owner's
    path 0, with its probe, waiting unread behind it (seen against a 7.3 kernel in the conformance suite's
    restart scenario: 28 messages, then nothing)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)

    def acceptor() -> tuple[TcpConn, TcpTransport]:
        conn, _svc, _stack, mgr = make_conn_and_transport(owner=False)
        page = rxseq.open_page(None, "stack", str(state))
        assert page is not None
        mgr.rx_page = page
        return _conn_on_page(mgr), mgr

    first, mgr = acceptor()
    port0 = kernel_port(0)
    first.accept(connect_from(port0, peers), port0)
    arrive(first.paths[0], peers[0], PROBE_7X)
    assert first.with_sport_idx and first.npaths == 8
    assert mgr.rx_page is not None
    mgr.rx_page.close(remove=False)  # SIGKILL: the file stays

    again, mgr2 = acceptor()
    assert again.with_sport_idx and again.npaths == 8 and len(again.paths) == 8
    ports = {index: kernel_port(index) for index in (3, 0, 6)}  # path 3's connection comes first
    for port in ports.values():
        again.accept(connect_from(port, peers), port)
    assert {index: again.paths[index].peer_port for index in ports} == ports
    assert again.host.counters["tcp_accept_deferred"] == 0
    assert mgr2.rx_page is not None
    mgr2.rx_page.close(remove=True)


def test_a_6_1_owner_leaves_no_pairing_to_resume(peers: list[socket.socket], tmp_path: Path) -> None:
    """A probe without SPORT_IDX (6.1) names nothing by port: the next service starts from the 6.1 rules."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    conn, _svc, _stack, mgr = make_conn_and_transport(owner=False)
    mgr.rx_page = rxseq.open_page(None, "stack", str(state))
    fresh = _conn_on_page(mgr)
    port = kernel_port(0)
    fresh.accept(connect_from(port, peers), port)
    probe_61 = RDSHeader(sequence=1, sport=1, dport=0, exthdr=(ExtHeader.npaths(8),))
    arrive(fresh.paths[0], peers[0], probe_61.encode())
    assert not fresh.with_sport_idx
    assert mgr.rx_page is not None
    mgr.rx_page.close(remove=False)
    _conn2, _svc2, _stack2, mgr2 = make_conn_and_transport(owner=False)
    mgr2.rx_page = rxseq.open_page(None, "stack", str(state))
    again = _conn_on_page(mgr2)
    assert not again.with_sport_idx and again.npaths == 0 and len(again.paths) == 1
    assert mgr2.rx_page is not None
    mgr2.rx_page.close(remove=True)


def _pong(ext: bytes) -> bytes:
    """A pong (port 0 -> RDS_FLAG_PROBE_PORT) answering our probe, with the handshake ``ext`` (PROBE_7X's
    extension headers, or none)."""
    head = RDSHeader(sequence=1, sport=0, dport=1).encode()
    return head[:32] + ext if ext else head


@pytest.mark.parametrize(
    ("frame", "dialled"),
    [
        pytest.param(_pong(PROBE_7X[32:]), [1, 2, 3, 4, 5, 6, 7], id="7x-pong: every path at once"),
        pytest.param(PROBE_7X, [1], id="7x-probe-only: the peer may not have read our SPORT_IDX"),
        pytest.param(
            RDSHeader(sequence=1, sport=0, dport=1, exthdr=(ExtHeader.npaths(8),)).encode(),
            [1],
            id="6.1-pong: one at a time",
        ),
    ],
)
def test_owner_fans_out_at_once_to_a_peer_that_pairs_by_port(
    peers: list[socket.socket], frame: bytes, dialled: list[int]
) -> None:
    """The owner dials every other path at once (rds_start_mprds) only when the peer's handshake carried
    SPORT_IDX and answered our probe on this path 0; else path 1 first, the rest one at a time."""
    conn, _svc, _stack = make_conn(owner=True)
    p0 = conn.paths[0]
    p0.established(connect_from(kernel_port(0), peers))
    p0.confirm()
    assert p0.confirmed
    arrive(p0, peers[-1], frame)
    assert conn.npaths == 8
    assert [p.index for p in conn.paths if p.dial_scheduled] == dialled


def test_fan_out_dials_waits_for_path_0_and_for_closing_paths() -> None:
    D, C, K, X = Lane.DOWN, Lane.CONNECTING, Lane.CONFIRMED, Lane.CLOSING
    assert fan_out_dials([D], 8) == [0]
    assert fan_out_dials([C, D], 8) == []
    assert fan_out_dials([K, C, D, K], 4) == [2]
    assert fan_out_dials([K], 4) == [1, 2, 3]  # paths not created yet count as down
    assert fan_out_dials([K, D, X], 3) == []  # a teardown in progress: wait until every path is down


def _owner_with_every_path_up(peers: list[socket.socket], frame: bytes) -> tuple[TcpConn, FakeSvc]:
    """An owner whose peer answered the probe on path 0 with ``frame``, and all 8 paths confirmed."""
    conn, svc, _stack = make_conn(owner=True)
    p0 = conn.paths[0]
    p0.established(connect_from(kernel_port(0), peers))
    p0.confirm()
    arrive(p0, peers[-1], frame)
    assert conn.npaths == 8
    for p in conn.paths[1:]:
        p.dial_scheduled = False  # dialled by hand: a real connection from the port that names the path
        p.established(connect_from(kernel_port(p.index), peers))
        p.confirm()
    assert all(p.confirmed for p in conn.paths)
    svc.timers.clear()
    return conn, svc


def test_a_lost_path_alone_is_redialled_to_a_peer_that_pairs_by_port(peers: list[socket.socket]) -> None:
    """Every kernel reconnects a lost path on its own (one rds_conn_path): to a peer that names paths by
    source port, the other seven keep their connections, and the lost one is dialled after SETTLE_DELAY."""
    conn, svc = _owner_with_every_path_up(peers, _pong(PROBE_7X[32:]))
    socks = [p.sock for p in conn.paths]
    conn.paths[3].lost()
    assert [p.index for p in conn.paths if p.dial_scheduled] == [3]
    assert [p.sock for p in conn.paths if p.index != 3] == [s for i, s in enumerate(socks) if i != 3]
    assert not any(p.closing for p in conn.paths)
    assert [d for d, _fn in svc.timers] == [tcp_conn.SETTLE_DELAY]  # first re-dial: no backoff yet
    # lost again before it came back: its own backoff grows (path 0's is untouched)
    conn.paths[3].dial_scheduled = False
    svc.timers.clear()
    conn.paths[3].lost()
    assert conn.backoffs[3].ceiling_ms > 0 and conn.backoffs[0].ceiling_ms == 0


@pytest.mark.parametrize(
    ("frame", "lost"),
    [
        pytest.param(_pong(PROBE_7X[32:]), 0, id="7x: path 0 lost"),
        pytest.param(
            RDSHeader(sequence=1, sport=0, dport=1, exthdr=(ExtHeader.npaths(8),)).encode(),
            3,
            id="6.1: path 3 lost",
        ),
    ],
)
def test_a_lost_path_0_or_a_path_to_a_6_1_peer_closes_every_path(
    peers: list[socket.socket], frame: bytes, lost: int
) -> None:
    """Path 0 carries the probe, where a restarting peer shows; a 6.1 acceptor gives a connection the first
    free path: every other path is closed and all are dialled again in order (pathset.py)."""
    conn, _svc = _owner_with_every_path_up(peers, frame)
    conn.paths[lost].lost()
    assert all(p.closing for p in conn.paths if p.index != lost)
    assert not any(p.dial_scheduled for p in conn.paths)


def test_a_scheduled_redial_waits_when_every_path_is_closed_meanwhile(peers: list[socket.socket]) -> None:
    """Path 3 was lost (its re-dial waits SETTLE_DELAY), then path 0 (a restarting peer): the close of every
    path follows, and path 3's dial, when its time comes, is not made: path 0 is dialled first."""
    conn, svc = _owner_with_every_path_up(peers, _pong(PROBE_7X[32:]))
    conn.paths[3].lost()
    conn.paths[0].lost()
    assert all(p.closing for p in conn.paths if p.index not in (0, 3))
    svc.run_timers(tcp_conn.SETTLE_DELAY)
    assert conn.paths[3].sock is None and not conn.paths[3].dial_scheduled
    assert conn.dials_now() == []  # paths still closing
