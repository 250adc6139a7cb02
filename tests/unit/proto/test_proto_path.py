"""Two PathEngines back to back over a simulated TCP byte stream with a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrds.constants import RDS_CONG_MAP_BYTES, RDS_MPATH_WORKERS, ExtHeaderType, HeaderFlag
from pyrds.userspace.proto import (
    CongestionMap,
    CongMapDropped,
    CongMapReceived,
    DuplicateDropped,
    Event,
    ExtHeader,
    MessageReceived,
    NpathsNegotiated,
    PathEngine,
    PathState,
    PeerGenChanged,
    PingReceived,
    PongReceived,
    ProtocolError,
    RDSHeader,
    SendQueueFull,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def tick(self, dt: float = 0.001) -> float:
        self.t += dt
        return self.t


def pair(index: int = 0) -> tuple[PathEngine, PathEngine, Clock]:
    clock = Clock()
    a = PathEngine("10.0.0.1", "10.0.0.2", index)
    b = PathEngine("10.0.0.2", "10.0.0.1", index)
    a.connection_made(clock.t)
    b.connection_made(clock.t)
    return a, b, clock


def pump(src: PathEngine, dst: PathEngine, clock: Clock, cuts: list[int] | None = None) -> list[Event]:
    """Move everything src has to dst (optionally re-chunked); TCP acks all of it."""
    data = src.bytes_to_send()
    events: list[Event] = []
    points = sorted({c % (len(data) + 1) for c in (cuts or [])} | {0, len(data)})
    for lo, hi in zip(points, points[1:], strict=False):
        events += dst.feed(data[lo:hi], clock.tick())
    src.acked_through(src.tx_bytes)
    return events


def delivered(events: list[Event]) -> list[bytes]:
    return [e.payload for e in events if isinstance(e, MessageReceived)]


def test_ordered_delivery_and_sequence_numbers() -> None:
    a, b, clock = pair()
    seqs = [a.queue(4000, 5000, f"m{i}".encode()) for i in range(10)]
    assert seqs == list(range(1, 11))
    ev = pump(a, b, clock)
    assert isinstance(ev[0], CongMapReceived)  # path 0 sends the map first
    msgs = [e for e in ev if isinstance(e, MessageReceived)]
    assert [m.payload for m in msgs] == [f"m{i}".encode() for i in range(10)]
    assert [m.header.sequence for m in msgs] == seqs
    assert all(m.header.sport == 4000 and m.header.dport == 5000 and m.header.flags == 0 for m in msgs)
    assert msgs[0].rx_time > 1000.0
    assert b.next_rx_seq == 11 and a.next_tx_seq == 11
    assert a.unacked == [] and a.queued_bytes == 0


@settings(max_examples=50)
@given(
    st.lists(st.binary(max_size=3000), min_size=1, max_size=15),
    st.lists(st.integers(0, 10**6), max_size=40),
)
def test_random_chunking_of_stream(payloads: list[bytes], cuts: list[int]) -> None:
    a, b, clock = pair()
    for p in payloads:
        a.queue(7, 8, p)
    assert delivered(pump(a, b, clock, cuts)) == payloads


def test_acked_through_is_tcp_byte_based() -> None:
    a, b, clock = pair(index=1)  # no cong map on path 1
    a.queue(1000, 2000, b"x" * 10)
    a.queue(1000, 2000, b"y" * 20)
    data = a.bytes_to_send()
    assert len(data) == 48 + 10 + 48 + 20
    assert a.acked_through(57) == []  # one byte of message 1 still unacked
    acked = a.acked_through(58)
    assert [(m.seq, m.length) for m in acked] == [(1, 10)]
    assert [u.seq for u in a.unacked] == [2]
    assert a.acked_through(50) == []  # going backwards is ignored
    with pytest.raises(ValueError):
        a.acked_through(len(data) + 1)
    assert [m.seq for m in a.acked_through(len(data))] == [2]


def test_cong_map_only_on_path_0_and_not_retransmitted() -> None:
    a, b, clock = pair(index=0)
    a.local_map.set(4000)
    data = a.bytes_to_send()
    assert len(data) == 48 + RDS_CONG_MAP_BYTES
    assert a.unacked == [] and a.next_tx_seq == 1  # seq 0, not queued as unacked
    ev = b.feed(data, clock.tick())
    assert isinstance(ev[0], CongMapReceived) and ev[0].map.ports() == [4000]
    assert b.next_rx_seq == 0  # cong maps do not touch sequence state
    a.connection_lost(clock.tick())
    a.connection_made(clock.tick())
    assert len(a.bytes_to_send()) == 48 + RDS_CONG_MAP_BYTES  # a fresh map, not a retransmission
    c, _, _ = pair(index=3)
    assert c.bytes_to_send() == b""


def test_queue_cong_map_coalesces() -> None:
    a, b, clock = pair()
    a.bytes_to_send()
    a.queue_cong_map()
    a.queue_cong_map()
    a.queue(1, 2, b"z")
    ev = b.feed(a.bytes_to_send(), clock.tick())
    assert [type(e) for e in ev] == [CongMapReceived, MessageReceived]


def test_cong_map_of_wrong_length_is_ignored_like_kernel() -> None:
    b = PathEngine("10.0.0.2", "10.0.0.1")
    b.connection_made(0.0)
    bad = RDSHeader(length=100, flags=HeaderFlag.CONG_BITMAP).encode() + b"\0" * 100
    assert b.feed(bad, 1.0) == [CongMapDropped(100)]
    assert b.state == PathState.UP


def test_reconnect_retransmits_and_receiver_delivers_exactly_once() -> None:
    a, b, clock = pair(index=1)
    payloads = [bytes([i]) * (i * 7 % 50) for i in range(20)]
    for p in payloads:
        a.queue(4000, 5000, p)
    data = a.bytes_to_send()
    got: list[bytes] = []
    cut = len(data) * 2 // 3
    got += delivered(b.feed(data[:cut], clock.tick()))  # the rest is lost with the connection
    a.acked_through(cut // 3)  # TCP acked only part of what b received
    assert 0 < len(got) < 20
    a.connection_lost(clock.tick())
    b.connection_lost(clock.tick())
    a.queue(4000, 5000, b"after")
    a.connection_made(clock.tick())
    b.connection_made(clock.tick())
    data2 = a.bytes_to_send()
    ev = b.feed(data2, clock.tick())
    dups = [e.seq for e in ev if isinstance(e, DuplicateDropped)]
    got += delivered(ev)
    assert got == payloads + [b"after"]
    assert dups and all(s < b.next_rx_seq for s in dups)
    resent = [RDSHeader.decode(data2[0:48])]
    assert resent[0].flags & HeaderFlag.RETRANSMITTED
    a.acked_through(a.tx_bytes)
    assert a.unacked == [] and a.queued_bytes == 0


def test_duplicate_rule_needs_retransmitted_flag() -> None:
    b = PathEngine("10.0.0.2", "10.0.0.1", 1)
    b.connection_made(0.0)
    m5 = RDSHeader(sequence=5, length=1, sport=1, dport=9).encode() + b"a"
    old = RDSHeader(sequence=3, length=1, sport=1, dport=9).encode() + b"b"
    old_rt = RDSHeader(sequence=3, length=1, sport=1, dport=9, flags=HeaderFlag.RETRANSMITTED).encode() + b"c"
    assert delivered(b.feed(m5, 1.0)) == [b"a"]
    assert delivered(b.feed(old, 1.0)) == [b"b"]  # lower seq without RETRANSMITTED is delivered
    assert b.next_rx_seq == 4
    ev = b.feed(old_rt, 1.0)
    assert ev == [DuplicateDropped(3)]


def test_ping_pong() -> None:
    a, b, clock = pair(index=1)
    seq = a.send_ping(4000)
    ev = pump(a, b, clock)
    assert ev == [PingReceived(4000, seq, True)]
    ev = pump(b, a, clock)
    (pong,) = ev
    assert isinstance(pong, MessageReceived)  # delivered to the pinging socket, like the kernel
    assert (pong.header.sport, pong.header.dport, pong.payload) == (0, 4000, b"")
    assert pong.header.sequence == 1 and b.next_tx_seq == 2  # the pong consumed a sequence number
    b.ping_enable = False
    a.send_ping(4001)
    ev = pump(a, b, clock)
    assert isinstance(ev[0], MessageReceived) and b.bytes_to_send() == b""


def test_ping_with_sport_0_ignored() -> None:
    b = PathEngine("10.0.0.2", "10.0.0.1", 1)
    b.connection_made(0.0)
    assert b.feed(RDSHeader(sequence=1).encode(), 1.0) == []
    assert b.bytes_to_send() == b"" and b.next_rx_seq == 2


def test_npaths_negotiation() -> None:
    a, b, clock = pair()
    a.bytes_to_send()
    b.bytes_to_send()
    probe_seq = a.send_probe()
    raw = a.bytes_to_send()
    h = RDSHeader.decode(raw)
    assert (h.sport, h.dport, h.sequence) == (1, 0, probe_seq)
    # NPATHS then SPORT_IDX (7.x sends GEN_NUM between them; SPORT_IDX last keeps 6.1 parsing sane)
    assert h.exthdr == (ExtHeader.npaths(RDS_MPATH_WORKERS), ExtHeader.sport_idx())
    ev = b.feed(raw, clock.tick())
    assert ev == [PingReceived(1, probe_seq, True), NpathsNegotiated(8, True)]
    pong = b.bytes_to_send()
    ph = RDSHeader.decode(pong)
    assert (ph.sport, ph.dport) == (0, 1) and ph.exthdr == (ExtHeader.npaths(8), ExtHeader.sport_idx())
    assert a.feed(pong, clock.tick()) == [PongReceived(1), NpathsNegotiated(8, True)]
    assert a.npaths == b.npaths == 8
    assert a.peer_sport_idx and b.peer_sport_idx


@pytest.mark.parametrize(
    ("exts", "expected"), [((ExtHeader.npaths(2),), 2), ((ExtHeader.npaths(64),), 8), ((), 1)]
)
def test_npaths_from_pong(exts: tuple[ExtHeader, ...], expected: int) -> None:
    a = PathEngine("10.0.0.1", "10.0.0.2")
    a.connection_made(0.0)
    pong = RDSHeader(sequence=1, sport=0, dport=1, exthdr=exts).encode()
    assert a.feed(pong, 1.0) == [PongReceived(1), NpathsNegotiated(expected)]


def test_gen_num_change_resets_sequences() -> None:
    a = PathEngine("10.0.0.1", "10.0.0.2", 1)
    a.connection_made(0.0)
    a.queue(1, 2, b"q")
    a.bytes_to_send()
    probe = RDSHeader(sequence=7, sport=1, dport=0, exthdr=(ExtHeader.gen_num(11),)).encode()
    assert PeerGenChanged not in [type(e) for e in a.feed(probe, 1.0)]
    probe2 = RDSHeader(sequence=8, sport=1, dport=0, exthdr=(ExtHeader.gen_num(12),)).encode()
    ev = a.feed(probe2, 2.0)
    changed = [e for e in ev if isinstance(e, PeerGenChanged)]
    assert [(e.old, e.new) for e in changed] == [(11, 12)]
    assert [m.length for m in changed[0].flushed] == [1]  # the unacked "q", never sent again
    assert a.next_rx_seq == 0 and a.unacked == []


def test_messages_queued_while_down_go_out_on_connect() -> None:
    a = PathEngine("10.0.0.1", "10.0.0.2", 2)
    b = PathEngine("10.0.0.2", "10.0.0.1", 2)
    a.queue(3, 4, b"early")
    assert a.bytes_to_send() == b"" and a.state == PathState.DOWN
    a.connection_made(1.0)
    b.connection_made(1.0)
    data = a.bytes_to_send()
    assert not RDSHeader.decode(data).flags & HeaderFlag.RETRANSMITTED
    assert delivered(b.feed(data, 2.0)) == [b"early"]


def test_queue_limits() -> None:
    a = PathEngine("10.0.0.1", "10.0.0.2", 1, max_queued_msgs=2, max_queued_bytes=10)
    a.queue(1, 2, b"12345")
    with pytest.raises(SendQueueFull):
        a.queue(1, 2, b"123456")
    a.queue(1, 2, b"12345")
    with pytest.raises(SendQueueFull):
        a.queue(1, 2, b"")
    with pytest.raises(ValueError):
        a.queue(1, 2, b"", extra_flags=HeaderFlag.CONG_BITMAP)


def test_pongs_bounded_when_sender_stalls() -> None:
    b = PathEngine("10.0.0.2", "10.0.0.1", 1, max_queued_msgs=4)
    b.connection_made(0.0)
    pings = b"".join(RDSHeader(sequence=i, sport=77, dport=0).encode() for i in range(1, 100))
    ev = b.feed(pings, 1.0)
    assert len(ev) == 99 and b.queued_msgs == 8 and b.pongs_dropped == 91


def test_oversized_message_is_protocol_error_and_state_error() -> None:
    b = PathEngine("10.0.0.2", "10.0.0.1", 1)
    b.connection_made(0.0)
    good = RDSHeader(sequence=1, length=2, dport=9, sport=3).encode() + b"ok"
    bad = RDSHeader(sequence=2, length=(1 << 20) + 1, dport=9, sport=3).encode()
    with pytest.raises(ProtocolError) as ei:
        b.feed(good + bad, 1.0)
    assert ei.value.reason == "msg_too_long"
    assert delivered(ei.value.partial) == [b"ok"]  # type: ignore[arg-type]
    assert b.state == PathState.ERROR


@settings(max_examples=200)
@given(st.lists(st.binary(max_size=200), max_size=40))
def test_garbage_never_raises_other_errors_and_stays_bounded(chunks: list[bytes]) -> None:
    b = PathEngine("10.0.0.2", "10.0.0.1", 0, max_len=1024, max_queued_msgs=16)
    b.connection_made(0.0)
    try:
        for c in chunks:
            b.feed(c, 1.0)
            assert b.framer.buffered <= 48 + 1024
            assert b.queued_msgs <= 32
    except ProtocolError:
        assert b.state == PathState.ERROR


def test_header_bytes_carry_zero_ack_credit_csum() -> None:
    a = PathEngine("10.0.0.1", "10.0.0.2", 1)
    a.connection_made(0.0)
    a.queue(1234, 4321, b"abc")
    raw = a.bytes_to_send()
    assert raw[8:16] == b"\0" * 8 and raw[25] == 0 and raw[30:32] == b"\0\0"
    assert raw[48:] == b"abc"


def test_local_map_is_shared_reference() -> None:
    shared = CongestionMap()
    a = PathEngine("10.0.0.1", "10.0.0.2", 0, local_map=shared)
    shared.set(99)
    a.connection_made(0.0)
    assert CongestionMap.from_bytes(a.bytes_to_send()[48:]).test(99)


PROBE_61 = RDSHeader(sequence=5, sport=1, dport=0, exthdr=(ExtHeader.npaths(8),)).encode()
# what 7.x rds_send_probe puts on the wire: NPATHS 8, GEN_NUM 0x1234, SPORT_IDX
PROBE_7X = RDSHeader(sequence=5, sport=1, dport=0).encode()[:32] + bytes(
    [5, 0, 8, 6, 0, 0, 0x12, 0x34, 8, 0, 0, 0, 0, 0, 0, 0]
)


def test_advertised_npaths_on_probe_and_pong() -> None:
    """A stack that must stay on one path (a 6.1 dialer it cannot pair) says NPATHS=1 on probes and pongs."""
    b = PathEngine("10.0.0.2", "10.0.0.1")
    b.connection_made(0.0)
    b.bytes_to_send()
    b.advertise_npaths = 1
    assert b.feed(PROBE_61, 1.0) == [PingReceived(1, 5, True), NpathsNegotiated(8, False)]
    h = RDSHeader.decode(b.bytes_to_send())
    assert (h.sport, h.dport) == (0, 1) and h.exthdr == (ExtHeader.npaths(1), ExtHeader.sport_idx())
    assert b.last_advertised == 1
    b.send_probe()
    h = RDSHeader.decode(b.bytes_to_send()[:48])
    assert h.ext(ExtHeaderType.NPATHS) == ExtHeader.npaths(1)


def test_peer_speaking_sport_idx_always_gets_every_path() -> None:
    """A 7.x probe (SPORT_IDX): the dialer names its paths by source port, so the one-path limit for 6.1
    dialers does not apply; c_with_sport_idx is re-evaluated at every probe/pong."""
    b = PathEngine("10.0.0.2", "10.0.0.1")
    b.connection_made(0.0)
    b.bytes_to_send()
    b.advertise_npaths = 1
    ev = b.feed(PROBE_7X, 1.0)
    assert ev == [PingReceived(1, 5, True), NpathsNegotiated(8, True)]
    assert b.peer_sport_idx and b.peer_gen_num == 0x1234
    pong = RDSHeader.decode(b.bytes_to_send())
    assert pong.exthdr == (ExtHeader.npaths(8), ExtHeader.sport_idx()) and b.last_advertised == 8
    b.send_probe()  # our own probe to a peer known to speak SPORT_IDX
    assert RDSHeader.decode(b.bytes_to_send()).ext(ExtHeaderType.NPATHS) == ExtHeader.npaths(8)
    probe = RDSHeader(sequence=6, sport=1, dport=0, exthdr=(ExtHeader.npaths(8),)).encode()
    assert NpathsNegotiated(8, False) in b.feed(probe, 2.0)  # the peer stopped sending it (a 6.1 again)
    assert not b.peer_sport_idx


def test_sport_idx_on_a_pong_is_recorded() -> None:
    a = PathEngine("10.0.0.1", "10.0.0.2")
    a.connection_made(0.0)
    exts = (ExtHeader.npaths(4), ExtHeader.sport_idx())
    pong = RDSHeader(sequence=1, sport=0, dport=1, exthdr=exts).encode()
    assert a.feed(pong, 1.0) == [PongReceived(1), NpathsNegotiated(4, True)]
    assert a.peer_sport_idx


def lanes() -> tuple[PathEngine, PathEngine]:
    lane0 = PathEngine("10.0.0.1", "10.0.0.2", 0)
    lane3 = PathEngine("10.0.0.1", "10.0.0.2", 3, lane0=lane0)
    for e in (lane0, lane3):
        e.connection_made(0.0)
        e.bytes_to_send()  # path 0's congestion map
    return lane0, lane3


def test_catchup_lane_waits_until_path0_messages_from_before_fan_out_are_acked() -> None:
    lane0, lane3 = lanes()
    early = [lane0.queue(4000, 5000, b"early%d" % i) for i in range(3)]
    lane0.begin_catchup()  # fan-out: c_cp0_mprds_catchup_tx_seq = cp_next_tx_seq
    assert lane0.catchup_tx_seq == early[-1] + 1
    lane3.queue(4000, 5000, b"later")
    # path 0 has not sent them yet (send queue)
    assert lane3.bytes_to_send() == b"" and lane3.held and lane3.catchup_retries == 1
    assert lane3.unsent and not lane3.unacked
    lane0.bytes_to_send()
    # sent, not acked (retransmit queue)
    assert lane3.bytes_to_send() == b"" and lane3.held and lane3.catchup_retries == 2
    lane0.acked_through(lane0.tx_bytes - 1)  # the last one is still partly unacked
    assert lane3.bytes_to_send() == b"" and lane3.catchup_retries == 3
    lane0.queue(4000, 5001, b"after fan-out")  # newer messages on path 0 do not hold anyone
    lane0.acked_through(lane0.tx_bytes)
    data = lane3.bytes_to_send()
    assert not lane3.held and lane3.catchup_retries == 3
    assert RDSHeader.decode(data).sport == 4000 and data.endswith(b"later")


def test_catchup_counts_only_when_a_lane_has_something_to_send() -> None:
    lane0, lane3 = lanes()
    lane0.queue(1, 2, b"x")
    lane0.begin_catchup()
    assert lane3.bytes_to_send() == b"" and not lane3.held and lane3.catchup_retries == 0
    lane3.queue_cong_map()  # the congestion map is not a message: it is not held (7.x sends it first)
    lane3.queue(1, 2, b"y")
    out = lane3.bytes_to_send()
    assert len(out) == 48 + RDS_CONG_MAP_BYTES and lane3.held


def test_catchup_includes_messages_the_caller_still_holds_for_path0() -> None:
    lane0, lane3 = lanes()
    lane0.begin_catchup(pending=2)  # two staged messages get the next two sequence numbers
    lane0.queue(1, 2, b"staged 1")
    lane0.queue(1, 2, b"staged 2")
    lane3.queue(1, 2, b"z")
    lane0.bytes_to_send()
    lane0.acked_through(lane0.tx_bytes - 1)
    assert lane3.bytes_to_send() == b""
    lane0.acked_through(lane0.tx_bytes)
    assert lane3.bytes_to_send().endswith(b"z")


def test_catchup_after_reconnect_waits_for_path0_retransmissions() -> None:
    lane0, lane3 = lanes()
    lane0.queue(1, 2, b"old")
    lane0.bytes_to_send()
    lane0.begin_catchup()
    lane0.connection_lost(1.0)
    lane3.queue(1, 2, b"new")
    assert lane3.bytes_to_send() == b""  # path 0 is down with "old" unacked
    lane0.connection_made(2.0)
    assert lane3.bytes_to_send() == b""  # requeued as a retransmission, not sent yet
    lane0.bytes_to_send()
    lane0.acked_through(lane0.tx_bytes)
    assert lane3.bytes_to_send().endswith(b"new")


def test_path0_itself_and_paths_without_lane0_never_wait() -> None:
    lane0, _ = lanes()
    lane0.queue(1, 2, b"a")
    lane0.begin_catchup()
    lane0.queue(1, 2, b"b")
    assert lane0.bytes_to_send().endswith(b"b") and not lane0.held
    solo = PathEngine("10.0.0.1", "10.0.0.2", 2)
    solo.connection_made(0.0)
    solo.queue(1, 2, b"c")
    assert solo.bytes_to_send().endswith(b"c")


def test_gen_num_change_flushes_and_ends_catchup() -> None:
    lane0, lane3 = lanes()
    lane0.feed(RDSHeader(sequence=1, sport=1, dport=0, exthdr=(ExtHeader.gen_num(1),)).encode(), 1.0)
    seq = lane0.queue(1, 2, b"unacked")
    lane0.bytes_to_send()
    lane0.begin_catchup()
    lane3.queue(1, 2, b"w")
    assert lane3.bytes_to_send() == b""
    ev = lane0.feed(RDSHeader(sequence=2, sport=1, dport=0, exthdr=(ExtHeader.gen_num(2),)).encode(), 2.0)
    changed = [e for e in ev if isinstance(e, PeerGenChanged)]
    assert len(changed) == 1 and [m.seq for m in changed[0].flushed] == [seq - 1, seq]  # the pong, "unacked"
    assert lane0.catchup_tx_seq == 0 and lane0.queued_bytes == 0
    assert lane3.bytes_to_send().endswith(b"w")


def test_max_pongs_caps_unacked_pongs_and_frees_them_on_ack() -> None:
    """A peer that pings without reading the pongs: at most ``max_pongs`` pongs are held (queued or unacked);
    further pings are not answered (``pongs_dropped``) until TCP acked some."""
    e = PathEngine("10.0.0.2", "10.0.0.1", max_pongs=3)
    e.connection_made(0.0)
    pings = b"".join(RDSHeader(seq, 0, 0, 4000, 0, 0, 0, 0, ()).encode() for seq in range(1, 6))
    events = e.feed(pings, 0.0)
    assert [ev.pong_queued for ev in events if isinstance(ev, PingReceived)] == [True] * 3 + [False] * 2
    assert e.queued_pongs == 3 and e.pongs_dropped == 2
    out = e.bytes_to_send()
    assert e.queued_pongs == 3  # written, not acked
    e.acked_through(len(out))
    assert e.queued_pongs == 0
    more = e.feed(RDSHeader(6, 0, 0, 4000, 0, 0, 0, 0, ()).encode(), 0.0)
    assert [ev.pong_queued for ev in more if isinstance(ev, PingReceived)] == [True]
    assert e.queued_pongs == 1


def test_cancel_takes_queued_and_written_messages_off_the_path() -> None:
    """``rds_send_drop_to``: a cancelled message never sent is not sent; one written and unacked is not
    retransmitted after a reconnect; its bytes and pong are released; the peer sees a sequence gap."""
    a, b, clock = pair()
    s1 = a.queue(1, 2, b"one")
    a.buffers_to_send()  # s1 written, not acked (TCP acks nothing below)
    s2 = a.queue(1, 2, b"two")
    s3 = a.queue(0, 9, b"")  # a pong
    s4 = a.queue(1, 2, b"four")
    assert a.queued_bytes == 10 and a.queued_pongs == 1
    [written] = a.cancel_many({s1})
    assert (written.seq, written.length) == (s1, 3)
    assert a.queued_bytes == 7
    [released] = a.cancel_many({s3})
    assert (released.seq, released.sport, released.dport) == (s3, 0, 9)
    assert a.queued_pongs == 0
    assert a.cancel_many({s3}) == [] and a.cancel_many({999}) == []
    assert [r.seq for r in a.unacked] == [] and [r.seq for r in a.unsent] == [s2, s4]
    a.connection_lost(clock.tick())
    b.connection_lost(clock.tick())
    a.connection_made(clock.tick())
    b.connection_made(clock.tick())
    events = pump(a, b, clock)
    got = [(e.header.sequence, e.payload) for e in events if isinstance(e, MessageReceived)]
    assert got == [(s2, b"two"), (s4, b"four")]
    assert b.next_rx_seq == s4 + 1 and a.queued_msgs == 0 and a.queued_bytes == 0


def test_cancel_of_a_written_message_keeps_byte_acks_right() -> None:
    """The acked offsets of the messages around a cancelled one still release them."""
    a, _b, _clock = pair()
    seqs = [a.queue(1, 2, bytes([i]) * 10) for i in range(3)]
    a.buffers_to_send()
    assert len(a.cancel_many({seqs[1]})) == 1
    assert [m.seq for m in a.acked_through(a.tx_bytes)] == [seqs[0], seqs[2]]
    assert a.queued_bytes == 0


def test_cancel_many_releases_exactly_the_given_messages_from_both_queues() -> None:
    """One call takes several messages off the retransmit queue (written) and the send queue (never
    written), returns them (retransmit queue first, each in order) with their bytes and pongs released as
    an ack would, ignores sequence numbers the path does not hold, and leaves the rest in order."""
    a, b, clock = pair()
    written = [a.queue(1, 2, bytes([65 + i]) * (i + 1)) for i in range(4)]
    a.feed(RDSHeader(1, 0, 0, 9, 0, 0, 0, 0, ()).encode(), clock.tick())  # a ping from port 9: a pong
    pong = written[-1] + 1
    a.buffers_to_send()  # all five written, none acked
    unsent = [a.queue(1, 2, bytes([97 + i]) * 10) for i in range(4)]
    assert a.queued_msgs == 9 and a.queued_bytes == 50 and a.queued_pongs == 1
    gone = a.cancel_many([unsent[2], written[3], 12345, pong, written[1], unsent[0]])
    assert [(m.seq, m.length, m.sport) for m in gone] == [
        (written[1], 2, 1),
        (written[3], 4, 1),
        (pong, 0, 0),
        (unsent[0], 10, 1),
        (unsent[2], 10, 1),
    ]
    assert a.queued_msgs == 4 and a.queued_bytes == 50 - 6 - 20 and a.queued_pongs == 0
    assert [r.seq for r in a.unacked] == [written[0], written[2]]
    assert [r.seq for r in a.unsent] == [unsent[1], unsent[3]]
    assert a.cancel_many({written[1], written[3], pong, unsent[0], 0}) == [] and a.queued_msgs == 4
    a.connection_lost(clock.tick())
    b.connection_lost(clock.tick())
    a.connection_made(clock.tick())
    b.connection_made(clock.tick())
    assert delivered(pump(a, b, clock)) == [b"A", b"CCC", b"b" * 10, b"d" * 10]
    assert a.queued_msgs == 0 and a.queued_bytes == 0


def test_cancel_many_keeps_the_others_and_their_byte_acks() -> None:
    """What stays after a cancel is sent, retransmitted after a reconnect and released by TCP's acks as if
    the cancelled messages had never been queued; a requeued retransmission can be cancelled too."""
    a, b, clock = pair()
    seqs = [a.queue(1, 2, bytes([65 + i]) * 10) for i in range(6)]
    a.buffers_to_send()
    released = a.cancel_many({seqs[1], seqs[4]})
    assert [m.seq for m in released] == [seqs[1], seqs[4]]
    a.connection_lost(clock.tick())
    b.connection_lost(clock.tick())
    a.connection_made(clock.tick())  # seqs 0, 2, 3, 5 requeued as retransmissions
    b.connection_made(clock.tick())
    assert [r.seq for r in a.unacked] == [seqs[0], seqs[2], seqs[3], seqs[5]]
    assert [m.seq for m in a.cancel_many({seqs[3], seqs[4]})] == [seqs[3]]
    events = pump(a, b, clock)
    got = [(e.header.sequence, e.payload[:1]) for e in events if isinstance(e, MessageReceived)]
    assert got == [(seqs[0], b"A"), (seqs[2], b"C"), (seqs[5], b"F")]
    assert all(e.header.flags & HeaderFlag.RETRANSMITTED for e in events if isinstance(e, MessageReceived))
    assert a.queued_msgs == 0 and a.queued_bytes == 0 and a.cancel_many(set()) == []
