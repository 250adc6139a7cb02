"""Path pairing and reconnect order (pathset): a model of the 6.1 acceptor and of a pyrds acceptor against the
owner's dial policy, with hypothesis choosing which paths fail and when."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrds.userspace.proto.pathset import (
    OWNER_PREAMBLE,
    PORT_TAG,
    Lane,
    accept_path,
    dial_port,
    is_tagged,
    next_dial,
    pyrds_dialer_port,
)


def test_dial_port_names_the_path() -> None:
    for index in range(8):
        for rand in (0, 1, 109, 110, 65535):
            port = dial_port(rand, index)
            assert 32768 <= port <= 60999
            assert is_tagged(port) and port & 7 == index and port & 0xFF == PORT_TAG | index


def test_dial_port_is_what_a_7x_acceptor_pairs_by_index() -> None:
    """7.x pairs an incoming connection with path ``sport % c_npaths``: a pyrds dialer's port for path i
    gives i for every npaths the paths can have."""
    for index in range(8):
        for rand in range(0, 65536, 97):
            port = dial_port(rand, index)
            assert port % 8 == index
            for n in (1, 2, 4, 8):
                if index < n:
                    assert port % n == index


def test_sport_idx_ports_like_7x_connect() -> None:
    from pyrds.userspace.proto.pathset import sport_idx_ports

    # ALIGN(port_low, 8) + group * 8 + cp_index, every group of the range, from the given one on
    ports = sport_idx_ports(3, 32770, 32800, 1)
    assert ports == [32787, 32795, 32779]  # ALIGN(32770, 8) = 32776: groups 0..2, from group 1
    assert all(p % 8 == 3 and 32770 <= p <= 32800 for p in ports)
    full = sport_idx_ports(5, 32768, 60999, 12345)
    assert len(full) == len(set(full)) == (60999 - 32768 + 1) // 8
    assert all(p % 8 == 5 for p in full)
    assert sport_idx_ports(0, 100, 103, 0) == []


def test_accept_with_sport_idx_pairs_by_port_modulo_npaths() -> None:
    """Once the peer's probe/pong carried SPORT_IDX: path ``port % npaths`` for any dialer (a 7.x kernel's
    untagged ports too); a busy path is reported as such (the connection then waits for it)."""
    busy = [True, False, False, True]
    assert accept_path(40003, busy, sport_idx=True) == (3, True)
    assert accept_path(40006, busy, sport_idx=True) == (2, False)  # 40006 % 8 == 6, % 4 == 2
    assert accept_path(dial_port(9, 1), busy, sport_idx=True) == (1, False)
    assert accept_path(40005, [True], sport_idx=True) == (0, True)  # npaths 1: always path 0
    assert accept_path(None, busy, sport_idx=True) == (1, False)  # no port: first free, as without it


def test_accept_tagged_pairs_by_index_and_replaces_stale() -> None:
    busy = [True, False, True, False]
    assert accept_path(dial_port(5, 2), busy) == (2, True)  # the owner re-dialled 2: waits for the old one
    assert accept_path(dial_port(5, 3), busy) == (3, False)
    assert accept_path(dial_port(5, 6), busy) is None  # beyond the negotiated paths


def test_accept_untagged_first_free_like_6_1() -> None:
    assert accept_path(None, [True, False, False]) == (1, False)
    assert accept_path(None, [True, True]) is None


def test_accept_single_path_redial_waits_instead_of_being_refused() -> None:
    # A 6.1 dialer writes as soon as TCP connects: refusing would discard what our TCP acked on it.
    assert accept_path(None, [True]) == (0, True)
    assert accept_path(None, [False]) == (0, False)


def test_random_ports_that_look_tagged_are_believed_only_where_a_pyrds_owner_could_dial() -> None:
    p0, p3 = dial_port(7, 0), dial_port(7, 3)
    assert pyrds_dialer_port(p0, 0, peer_is_61=False) == p0
    assert pyrds_dialer_port(p3, 0, peer_is_61=False) is None  # no handshake yet: not a pyrds path 3
    assert pyrds_dialer_port(p3, 1, peer_is_61=False) is None
    assert pyrds_dialer_port(p3, 4, peer_is_61=False) == p3
    assert pyrds_dialer_port(p0, 4, peer_is_61=True) is None  # a known 6.1 dialer: every port is random
    assert pyrds_dialer_port(40001, 4, peer_is_61=False) is None


def test_next_dial_in_order_one_at_a_time() -> None:
    D, C, K, X = Lane.DOWN, Lane.CONNECTING, Lane.CONFIRMED, Lane.CLOSING
    assert next_dial([D], 0) == 0
    assert next_dial([C], 0) is None
    assert next_dial([K, D, D], 3) == 1
    assert next_dial([K, C, D], 3) is None
    assert next_dial([K, K, K], 3) is None
    assert next_dial([K, K], 4) == 2  # paths not created yet count as down
    assert next_dial([D, D, X], 3) is None  # a teardown in progress: wait until every path is down


class Peer61:
    """The 6.1 acceptor: ``rds_tcp_accept_one_path`` gives the first DOWN path, else resets."""

    def __init__(self, n: int) -> None:
        self.up = [False] * n

    def accept(self, _port: int) -> int | None:
        for i, up in enumerate(self.up):
            if not up:
                self.up[i] = True
                return i
        return None


class PeerPyrds:
    def __init__(self, n: int) -> None:
        self.up = [False] * n

    def accept(self, port: int) -> int | None:
        got = accept_path(port, self.up)
        if got is None:
            return None
        self.up[got[0]] = True
        return got[0]


def run_owner(peer: Peer61 | PeerPyrds, n: int, failures: list[tuple[int, int]], stale: bool) -> None:
    """The owner follows next_dial; on a failure of path ``f`` it tears every path down (each close reaches
    the peer before the next dial, unless ``stale``: then the peer's path f stays up and a pyrds acceptor
    must give it the re-dial once the old one is gone). Asserts that every connection lands on the peer path
    with the same index."""
    lanes = [Lane.DOWN] * n
    pairing: dict[int, int] = {}
    pending = list(failures)
    for _ in range(20 * n * (len(failures) + 1)):
        if pending and pending[0][0] == 0:
            _, failed = pending.pop(0)
            failed %= n
            for i in range(n):
                if lanes[i] != Lane.DOWN:
                    lanes[i] = Lane.DOWN
                    if not (stale and i == failed and isinstance(peer, PeerPyrds)):
                        peer.up[pairing.pop(i)] = False
            continue
        if pending:
            pending[0] = (pending[0][0] - 1, pending[0][1])
        index = next_dial(lanes, n)
        if index is None:
            if not pending:
                break
            continue
        got = peer.accept(dial_port(index * 7919, index))
        assert got == index, f"path {index} paired with the peer's path {got}"
        pairing[index] = got
        lanes[index] = Lane.CONFIRMED
    assert all(lane == Lane.CONFIRMED for lane in lanes)


@settings(max_examples=200, deadline=None)
@given(
    n=st.sampled_from([1, 2, 4, 8]),
    failures=st.lists(st.tuples(st.integers(0, 10), st.integers(0, 7)), max_size=6),
    stale=st.booleans(),
)
def test_pairing_stays_identity_across_reconnects(
    n: int, failures: list[tuple[int, int]], stale: bool
) -> None:
    run_owner(Peer61(n), n, failures, stale=False)
    run_owner(PeerPyrds(n), n, failures, stale=stale)


def test_independent_redial_would_cross_paths_on_a_6_1_acceptor() -> None:
    """Why the owner re-dials in order: paths re-dialled independently land on the first free peer path."""
    peer = Peer61(4)
    for i in range(4):
        assert peer.accept(0) == i
    peer.up[1] = peer.up[3] = False  # paths 1 and 3 dropped; the owner re-dials 3 first
    assert peer.accept(0) == 1  # our path 3 now feeds the peer's path 1: sequence spaces crossed


def test_owner_preamble_is_dropped_without_effect_fresh_and_after_traffic() -> None:
    from pyrds.userspace.proto.events import DuplicateDropped, MessageReceived, PingReceived
    from pyrds.userspace.proto.path import PathEngine

    b = PathEngine("10.0.0.2", "10.0.0.1", 1)
    b.connection_made(0.0)
    assert b.feed(OWNER_PREAMBLE, 0.1) == []  # fresh path: a ping from port 0, ignored (no pong)
    assert b.bytes_to_send() == b""
    a = PathEngine("10.0.0.1", "10.0.0.2", 1)
    a.connection_made(0.0)
    a.queue(4000, 5000, b"one")
    ev = b.feed(a.bytes_to_send(), 0.2)
    assert [e.payload for e in ev if isinstance(e, MessageReceived)] == [b"one"]
    before = b.next_rx_seq
    ev = b.feed(OWNER_PREAMBLE, 0.3)  # after traffic: an old duplicate
    assert len(ev) == 1 and isinstance(ev[0], DuplicateDropped)
    assert not any(isinstance(e, PingReceived | MessageReceived) for e in ev)
    assert b.next_rx_seq == before


class Peer7x:
    """7.x ``rds_tcp_accept_one_path`` once ``c_with_sport_idx``: path ``sport % npaths`` if it is DOWN, else
    the socket is stashed and accepted when that path goes down."""

    def __init__(self, n: int) -> None:
        self.up = [False] * n
        self.stash: list[int] = []
        self.placed: list[tuple[int, int]] = []

    def accept(self, port: int) -> None:
        self.stash.append(port)
        self._drain()

    def down(self, index: int) -> None:
        self.up[index] = False
        self._drain()

    def _drain(self) -> None:
        for port in list(self.stash):
            index = port % len(self.up)
            if not self.up[index]:
                self.up[index] = True
                self.stash.remove(port)
                self.placed.append((port, index))


@settings(max_examples=200, deadline=None)
@given(
    n=st.sampled_from([1, 2, 4, 8]),
    failures=st.lists(st.integers(0, 7), max_size=6),
    late=st.booleans(),
)
def test_pyrds_owner_paths_pair_identically_on_a_7x_acceptor(n: int, failures: list[int], late: bool) -> None:
    """Whatever the order and however late the 7.x acceptor notices a closed path, each pyrds path lands on
    the peer path with its index (its source port names it)."""
    peer = Peer7x(n)
    ports = {i: dial_port(i * 7919 + 1, i) for i in range(n)}
    for i in range(n):
        peer.accept(ports[i])
    for f in failures:  # the owner closes everything and re-dials in order
        for i in range(n):
            ports[i] = dial_port((i + 1) * (f + 3) * 104729, i)
            if late:  # the peer sees the close only after the re-dial arrived
                peer.accept(ports[i])
                peer.down(i)
            else:
                peer.down(i)
                peer.accept(ports[i])
    assert not peer.stash
    assert all(port % 8 == index for port, index in peer.placed)


@settings(max_examples=200, deadline=None)
@given(
    order=st.permutations(list(range(1, 8))),
    groups=st.lists(st.integers(0, 3500), min_size=8, max_size=8),
)
def test_7x_dialer_parallel_redials_pair_on_a_pyrds_acceptor_with_sport_idx(
    order: list[int], groups: list[int]
) -> None:
    """A 7.x owner re-dials its paths in parallel from ``ALIGN(low, 8) + group * 8 + i``; a pyrds acceptor
    that saw SPORT_IDX pairs them by index in any arrival order, each once its stale connection is gone."""
    busy = [True] * 8
    for i in order:
        port = 32768 + groups[i] * 8 + i
        assert not is_tagged(port) or port & 7 == i
        assert accept_path(port, busy, sport_idx=True) == (i, True)
