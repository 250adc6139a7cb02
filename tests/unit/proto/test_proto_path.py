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
    assert h.exthdr == (ExtHeader.npaths(RDS_MPATH_WORKERS),)  # mainline: one extension only
    ev = b.feed(raw, clock.tick())
    assert ev == [PingReceived(1, probe_seq, True), NpathsNegotiated(8)]
    pong = b.bytes_to_send()
    ph = RDSHeader.decode(pong)
    assert (ph.sport, ph.dport) == (0, 1) and ph.ext(ExtHeaderType.NPATHS) == ExtHeader.npaths(8)
    assert a.feed(pong, clock.tick()) == [PongReceived(1), NpathsNegotiated(8)]
    assert a.npaths == b.npaths == 8


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
    assert PeerGenChanged(11, 12) in ev
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


def test_advertised_npaths_on_probe_and_pong() -> None:
    """A stack that must stay on one path (a 6.1 dialer it cannot pair) says NPATHS=1 on probes and pongs."""
    a, b, clock = pair()
    a.bytes_to_send()
    b.bytes_to_send()
    b.advertise_npaths = 1
    a.send_probe()
    ev = b.feed(a.bytes_to_send(), clock.tick())
    assert NpathsNegotiated(8) in ev
    assert a.feed(b.bytes_to_send(), clock.tick()) == [PongReceived(1), NpathsNegotiated(1)]
    b.send_probe()
    h = RDSHeader.decode(b.bytes_to_send()[:48])
    assert h.ext(ExtHeaderType.NPATHS) == ExtHeader.npaths(1)
