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


def test_accept_tagged_pairs_by_index_and_replaces_stale() -> None:
    busy = [True, False, True, False]
    assert accept_path(dial_port(5, 2), busy) == (2, True)  # the owner re-dialled 2: the old one is stale
    assert accept_path(dial_port(5, 3), busy) == (3, False)
    assert accept_path(dial_port(5, 6), busy) is None  # beyond the negotiated paths


def test_accept_untagged_first_free_like_6_1() -> None:
    assert accept_path(None, [True, False, False]) == (1, False)
    assert accept_path(None, [True, True]) is None


def test_accept_single_path_redial_replaces_instead_of_refusing() -> None:
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
    must replace it). Asserts that every connection lands on the peer path with the same index."""
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
