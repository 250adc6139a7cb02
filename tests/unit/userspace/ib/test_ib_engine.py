"""Two IbEngines over the fake verbs layer (ib_fakeverbs): round trips, fragments, acks, reconnect."""

from __future__ import annotations

import ipaddress
import random
from typing import Any

import pytest
from ib_fakeverbs import Clock, FakeLink

from pyrds.constants import RDS_CONG_MAP_BYTES, RDS_HEADER_SIZE, HeaderFlag
from pyrds.userspace.proto import (
    CongestionMap,
    CongMapReceived,
    DuplicateDropped,
    MessageReceived,
    PathState,
    PingReceived,
    RDSHeader,
)
from pyrds.userspace.proto.header import checksum_ok
from pyrds.userspace.stack import rdma
from pyrds.userspace.transports.ib.engine import IbEngine
from pyrds.userspace.transports.ib.events import IbEvent, MessagesAcked, SequenceGap
from pyrds.userspace.transports.ib.frag import SendWR, WrKind
from pyrds.userspace.transports.ib.wire import ACK_WR_ID, RDS_FRAG_SIZE, RECV_BUF_SIZE

A4 = ipaddress.IPv4Address("10.0.0.1")
B4 = ipaddress.IPv4Address("10.0.0.2")
A6 = ipaddress.IPv6Address("fd00::1")
B6 = ipaddress.IPv6Address("fd00::2")

SIZES = [0, 1, 4096, 4097, 64 * 1024, 1 << 20]


def link(v6: bool = False, **kw: Any) -> FakeLink:
    la, lb = (A6, B6) if v6 else (A4, B4)
    return FakeLink(IbEngine(la, lb, **kw), IbEngine(lb, la, **kw))


def payload(n: int, salt: int = 0) -> bytes:
    return bytes((i * 7 + salt) & 0xFF for i in range(n))


def delivered(events: list[IbEvent]) -> list[MessageReceived]:
    return [e for e in events if isinstance(e, MessageReceived)]


def acked_seqs(events: list[IbEvent]) -> list[int]:
    return [m.seq for e in events if isinstance(e, MessagesAcked) for m in e.messages]


def data_frames(frames: list[SendWR]) -> list[SendWR]:
    return [f for f in frames if f.kind is WrKind.DATA]


@pytest.mark.parametrize("v6", [False, True])
@pytest.mark.parametrize("size", SIZES)
def test_round_trip(size: int, v6: bool) -> None:
    lk = link(v6)
    lk.connect()
    msg = payload(size, 1)
    seq = lk.a.engine.queue(4000, 5000, msg)
    back = lk.b.engine.queue(5000, 4000, payload(size, 2))
    lk.pump()
    got = delivered(lk.b.events)
    assert [(m.header.sport, m.header.dport, m.header.sequence, m.payload) for m in got] == [
        (4000, 5000, seq, msg)
    ]
    assert [m.payload for m in delivered(lk.a.events)] == [payload(size, 2)]
    frames = [f for f in data_frames(lk.b.frames) if f.seq == seq]
    assert len(frames) == max(1, -(-size // RDS_FRAG_SIZE))
    assert all(f.header == frames[0].header and checksum_ok(f.header) for f in frames)
    assert all(len(f.payload) == RDS_FRAG_SIZE for f in frames[:-1])
    assert sum(len(f.payload) for f in frames) == size
    # the first message carries ACK_REQUIRED: each side acked the other's message
    assert acked_seqs(lk.a.events) == [seq] and acked_seqs(lk.b.events) == [back]
    assert lk.a.engine.path.queued_msgs == 0 and lk.b.engine.path.queued_msgs == 0


def test_work_request_flags_of_a_64k_message() -> None:
    lk = link()
    lk.connect()
    lk.pump()
    lk.a.engine.queue(1, 2, payload(64 * 1024))
    lk.pump()
    frames = data_frames(lk.b.frames)
    assert len(frames) == 16
    assert [f.solicited for f in frames] == [False] * 15 + [True]
    assert frames[-1].signaled
    assert all(len(f.data) <= RECV_BUF_SIZE for f in frames)
    run = longest = 0
    for f in lk.b.frames:  # every SEND of the connection, congestion map included
        run = 0 if f.signaled else run + 1
        longest = max(longest, run)
    assert longest <= 16


def test_signalled_every_17th_wr_like_the_kernel_countdown() -> None:
    lk = link()
    lk.connect()
    lk.pump()
    lk.a.engine.queue(1, 2, payload(40 * RDS_FRAG_SIZE))
    wrs = lk.a.engine.poll_send()
    assert [i for i, w in enumerate(wrs) if w.signaled] == [16, 33, 39]


def test_ordering_both_ways_mixed_sizes() -> None:
    lk = link()
    lk.connect()
    sizes = [0, 5, 4096, 9000, 1, 70000, 3, 4097, 0, 12345] * 5
    for i, n in enumerate(sizes):
        lk.a.engine.queue(10, 20, payload(n, i))
        lk.b.engine.queue(20, 10, payload(n, i + 100))
    lk.pump()
    assert [m.payload for m in delivered(lk.b.events)] == [payload(n, i) for i, n in enumerate(sizes)]
    assert [m.payload for m in delivered(lk.a.events)] == [payload(n, i + 100) for i, n in enumerate(sizes)]
    assert lk.a.engine.path.queued_msgs == 0 and lk.b.engine.path.queued_msgs == 0


def test_ack_required_policy_and_ack_only_frames() -> None:
    lk = link()
    lk.connect()
    lk.pump()
    seqs = []
    for i in range(25):
        seqs.append(lk.a.engine.queue(1, 2, payload(10, i)))
        lk.pump()  # one at a time: nothing for b to piggyback on, so it answers with ACK-only frames
    frames = data_frames(lk.b.frames)
    flagged = [f.seq for f in frames if RDSHeader.decode(f.header).flags & HeaderFlag.ACK_REQUIRED]
    assert flagged == [seqs[0], seqs[9], seqs[18]]  # send.c counter: first, then after 8 more
    assert lk.a.engine.counters["send_ack_required"] == 3 and lk.b.engine.counters["recv_ack_required"] == 3
    acks = [f for f in lk.a.frames if f.kind is WrKind.ACK]
    assert len(acks) == 3 and lk.b.engine.counters["ib_ack_sent"] == 3
    for f, seq in zip(acks, flagged, strict=True):
        h = RDSHeader.decode(f.data)
        assert len(f.data) == RDS_HEADER_SIZE and f.wr_id == ACK_WR_ID and f.signaled and f.solicited
        assert (h.sequence, h.sport, h.dport, h.length, h.flags, h.ack) == (0, 0, 0, 0, 0, seq)
        assert checksum_ok(f.data) and h.csum != 0
    assert acked_seqs(lk.a.events) == seqs[:19]  # released through the last ACK_REQUIRED message
    assert lk.a.engine.path.queued_msgs == 6


def test_max_unacked_bytes_forces_ack_required() -> None:
    lk = link(max_unacked_bytes=10_000)
    lk.connect()
    lk.pump()
    for i in range(4):
        lk.a.engine.queue(1, 2, payload(6000, i))
    lk.pump()
    flags = [RDSHeader.decode(f.header).flags for f in data_frames(lk.b.frames) if f.frag == 0]
    assert [bool(fl & HeaderFlag.ACK_REQUIRED) for fl in flags] == [True, False, True, False]


def test_h_ack_piggybacked_on_data_answers_a_pending_ack_request() -> None:
    lk = link()
    lk.connect()
    lk.pump()
    seq = lk.a.engine.queue(1, 2, b"x")  # ACK_REQUIRED (first message)
    lk.post(lk.a)
    lk.deliver_one(lk.b)
    lk.b.engine.queue(2, 1, b"reply")
    wrs = lk.b.engine.poll_send()
    assert [w.kind for w in wrs] == [WrKind.ACK, WrKind.DATA]  # the ACK goes first, then data also carries it
    assert RDSHeader.decode(wrs[1].header).ack == seq


def test_ack_only_frames_interleave_with_fragments() -> None:
    lk = link(send_wr=2)
    lk.connect()
    lk.pump()
    big = payload(64 * 1024, 9)
    lk.a.engine.queue(1, 2, big)
    lk.post(lk.a)  # two fragments: the ring is full
    assert lk.a.engine.ring_used == 2 and lk.a.engine.counters["ib_tx_ring_full"] == 1
    lk.b.engine.queue(2, 1, b"needs an ack")  # first message of b: ACK_REQUIRED
    lk.post(lk.b)
    lk.deliver_one(lk.a)
    lk.post(lk.a)  # only the ACK-only frame fits (it has its own work request)
    lk.pump()
    kinds = [f.kind for f in lk.b.frames if f.kind is not WrKind.CONG]
    first, last = kinds.index(WrKind.DATA), len(kinds) - 1 - kinds[::-1].index(WrKind.DATA)
    assert WrKind.ACK in kinds[first:last]
    assert [m.payload for m in delivered(lk.b.events)] == [big]
    assert lk.b.engine.counters["ib_ack_received"] >= 1


def test_ack_requests_coalesce_while_one_ack_is_in_flight() -> None:
    clock = Clock()
    rx, tx = IbEngine(A4, B4), IbEngine(B4, A4, max_unacked_packets=0)  # every message ACK_REQUIRED
    rx.established(clock.t)
    tx.established(clock.t)
    tx.path.take_cong_map()
    rx.path.take_cong_map()
    for _ in range(3):
        tx.queue(1, 2, b"m")
    wrs = tx.poll_send()
    assert len(wrs) == 3
    rx.recv_complete(wrs[0].data, clock.tick())
    first = rx.poll_send()
    assert [w.kind for w in first] == [WrKind.ACK]
    rx.recv_complete(wrs[1].data, clock.tick())
    rx.recv_complete(wrs[2].data, clock.tick())
    assert [w for w in rx.poll_send() if w.kind is WrKind.ACK] == []  # one in flight: coalesced
    rx.send_complete(ACK_WR_ID)
    again = [w for w in rx.poll_send() if w.kind is WrKind.ACK]
    assert len(again) == 1 and RDSHeader.decode(again[0].data).ack == wrs[2].seq
    assert rx.counters["ib_ack_sent"] == 2


def test_congestion_map_is_sent_on_connect_both_ways() -> None:
    lk = link()
    lk.a.engine.path.local_map.set(4000)
    lk.b.engine.path.local_map.set(77)
    lk.connect()
    lk.pump()
    for side, port in ((lk.b, 4000), (lk.a, 77)):
        cong = side.frames[:2]
        assert [f.kind for f in cong] == [WrKind.CONG, WrKind.CONG]
        h = RDSHeader.decode(cong[0].header)
        assert (h.sequence, h.sport, h.dport, h.length, h.flags) == (0, 0, 0, RDS_CONG_MAP_BYTES, 0x01)
        assert [len(f.payload) for f in cong] == [4096, 4096] and cong[1].solicited and not cong[0].solicited
        maps = [e.map for e in side.events if isinstance(e, CongMapReceived)]
        assert len(maps) == 1 and maps[0].ports() == [port]
    assert lk.a.engine.path.next_tx_seq == 1  # the map is not sequenced


def test_ping_gets_a_pong() -> None:
    lk = link()
    lk.connect()
    seq = lk.a.engine.send_ping(4444)
    lk.pump()
    assert [e for e in lk.b.events if isinstance(e, PingReceived)] == [PingReceived(4444, seq, True)]
    pongs = delivered(lk.a.events)
    assert [(m.header.sport, m.header.dport, m.payload) for m in pongs] == [(0, 4444, b"")]


def test_private_data_ack_seq_releases_messages_the_peer_already_has() -> None:
    lk = link()
    lk.connect()
    lk.pump()
    for i in range(3):
        lk.a.engine.queue(1, 2, payload(100, i))
    lk.a.engine.queue(1, 2, payload(50_000, 3))
    lk.post(lk.a)
    for _ in range(3 + 5):  # the three small messages and 5 of the big one's 13 fragments
        lk.deliver_one(lk.b)
    lk.disconnect()
    assert lk.b.engine.state == PathState.DOWN
    lk.a.events.clear()
    lk.b.frames.clear()
    lk.connect()  # b's REP carries ack_seq 3: only the big message is sent again
    assert acked_seqs(lk.a.events) == [1, 2, 3]
    lk.pump()
    again = data_frames(lk.b.frames)
    assert {f.seq for f in again} == {4}
    h = RDSHeader.decode(again[0].header)
    assert h.flags & HeaderFlag.RETRANSMITTED and h.flags & HeaderFlag.ACK_REQUIRED
    got = delivered(lk.b.events)
    assert [m.payload for m in got] == [payload(100, i) for i in range(3)] + [payload(50_000, 3)]


def delivered_unacked(size: int, count: int) -> tuple[Any, list[int]]:
    """A connected link whose b holds ``count`` messages of ``size`` bytes from a, none acked yet (b's ACK
    never left b); the link and the messages' sequence numbers."""
    lk = link()
    lk.connect()
    lk.pump()
    seqs = [lk.a.engine.queue(1, 2, payload(size, i)) for i in range(count)]
    lk.post(lk.a)
    while lk.b.wire_in:
        lk.deliver_one(lk.b)
    return lk, seqs


def reconnect_with_ack_seq_zero(lk: Any) -> None:
    """Drop the link and connect again with b's REP saying ack_seq 0, as a 6.1/6.12 kernel's does: a resends
    everything unacked. b's events and frames start empty."""
    lk.disconnect()
    real_on_request = lk.b.engine.on_request

    def kernel_like(data: bytes | bytearray | memoryview, now: float):  # type: ignore[no-untyped-def]
        answer = real_on_request(data, now)
        rep = bytearray(answer.private_data)
        rep[16:24] = bytes(8)  # ack_seq of the IPv4 layout
        return type(answer)(answer.accept, bytes(rep), answer.reason)

    lk.b.engine.on_request = kernel_like
    lk.b.events.clear()
    lk.b.frames.clear()
    lk.connect()
    lk.pump()


def test_reconnect_retransmits_and_the_receiver_drops_duplicates() -> None:
    """Against a peer that, like a 6.1/6.12 kernel, sends ack_seq 0: everything unacked comes again."""
    lk, seqs = delivered_unacked(5000, 4)
    reconnect_with_ack_seq_zero(lk)
    again = [f for f in data_frames(lk.b.frames) if f.frag == 0]
    assert [f.seq for f in again] == seqs
    assert all(RDSHeader.decode(f.header).flags & HeaderFlag.RETRANSMITTED for f in again)
    assert [e.seq for e in lk.b.events if isinstance(e, DuplicateDropped)] == seqs
    assert delivered(lk.b.events) == []
    assert acked_seqs(lk.a.events) == seqs  # the retransmissions carry ACK_REQUIRED: b acked them
    # new traffic after the duplicates flows normally
    lk.a.engine.queue(1, 2, b"after")
    lk.pump()
    assert [m.payload for m in delivered(lk.b.events)] == [b"after"]


def test_ack_required_counters_refill_on_reset_like_rds_send_path_reset() -> None:
    lk = link()
    lk.connect()
    lk.pump()
    for i in range(9):  # the first carries ACK_REQUIRED, the next 8 use the counters up
        lk.a.engine.queue(1, 2, bytes([i]))
    lk.pump()
    lk.b.engine.queue(2, 1, b"piggybacks h_ack 9")
    lk.pump()
    assert lk.a.engine.path.queued_msgs == 0  # nothing to retransmit
    lk.disconnect()
    lk.connect()
    lk.pump()
    lk.b.frames.clear()
    lk.a.engine.queue(1, 2, b"2")
    lk.pump()
    (frame,) = data_frames(lk.b.frames)
    assert not RDSHeader.decode(frame.header).flags & HeaderFlag.ACK_REQUIRED  # counters refilled to 8


def test_congestion_map_update_is_queued_again() -> None:
    lk = link()
    lk.connect()
    lk.pump()
    lk.a.engine.path.local_map.set(9)
    lk.a.engine.queue_cong_map()
    lk.pump()
    maps = [e.map for e in lk.b.events if isinstance(e, CongMapReceived)]
    assert [m.ports() for m in maps] == [[], [9]]
    assert maps[-1] == lk.a.engine.path.local_map and isinstance(maps[-1], CongestionMap)


@pytest.mark.parametrize("kernel_like_peer", [False, True])
def test_exactly_once_in_order_across_random_reconnects(kernel_like_peer: bool) -> None:
    """Random traffic both ways, SENDs lost in flight at random reconnects: every message arrives once, in
    order (retransmission after reconnect, duplicate drop, partial reassembly discarded)."""
    rng = random.Random(0x1B0 + kernel_like_peer)
    lk = link(send_wr=8)
    if kernel_like_peer:  # both sides' private data say ack_seq 0, as a 6.1/6.12 kernel's do
        for eng in (lk.a.engine, lk.b.engine):
            eng_on_request, eng_connect = eng.on_request, eng.connect

            def zero_req(now: float, _c: Any = eng_connect) -> bytes:
                raw = bytearray(_c(now))
                raw[16:24] = bytes(8)
                return bytes(raw)

            def zero_rep(data: bytes | bytearray | memoryview, now: float, _r: Any = eng_on_request) -> Any:
                answer = _r(data, now)
                rep = bytearray(answer.private_data)
                if answer.accept:
                    rep[16:24] = bytes(8)
                return type(answer)(answer.accept, bytes(rep), answer.reason)

            eng.connect = zero_req  # type: ignore[method-assign]
            eng.on_request = zero_rep  # type: ignore[method-assign]
    lk.connect()
    sent: dict[str, list[bytes]] = {"a": [], "b": []}
    sizes = [0, 1, 100, 4096, 4097, 9000, 20000]
    for step in range(3000):
        r = rng.random()
        side, name = (lk.a, "a") if rng.random() < 0.5 else (lk.b, "b")
        if r < 0.2:
            data = payload(rng.choice(sizes), step)
            side.engine.queue(7, 8, data)
            sent[name].append(data)
        elif r < 0.5:
            lk.post(side)
        elif r < 0.995:
            lk.deliver_one(side)
        else:
            lk.disconnect()
            lk.connect()
    lk.pump()
    assert [m.payload for m in delivered(lk.b.events)] == sent["a"]
    assert [m.payload for m in delivered(lk.a.events)] == sent["b"]
    dups = sum(isinstance(e, DuplicateDropped) for e in lk.a.events + lk.b.events)
    assert (dups > 0) == kernel_like_peer


def test_cancel_partly_posted_message_completes_queued_ones_and_their_rdma_never_go_out() -> None:
    """``rds_send_drop_to`` over RDS/IB: the message being posted (``cp_xmit_rm``) still goes out whole; a
    cancelled message still queued is never posted, nor is its RDMA op (an object the fake link could not
    carry out); the next message arrives after the sequence gap."""
    lk = link(send_wr=4)
    lk.connect()
    lk.pump()
    eng = lk.a.engine
    s1 = eng.queue(1, 2, payload(5 * RDS_FRAG_SIZE))
    s2 = eng.queue(1, 2, b"two", rdma=object())
    s3 = eng.queue(1, 2, b"three")
    assert lk.post(lk.a) == 4 and eng.ring_used == 4  # four of s1's five fragments posted
    assert len(eng.cancel_many({s1})) == 1 and len(eng.cancel_many({s2})) == 1
    assert eng.cancel_many({s2}) == []
    lk.pump()
    assert [(m.header.sequence, len(m.payload)) for m in delivered(lk.b.events)] == [
        (s1, 5 * RDS_FRAG_SIZE),
        (s3, 5),
    ]
    assert all(f.kind is not WrKind.RDMA for f in lk.b.frames)
    assert [r.seq for r in eng.path.unacked] == [s3] or acked_seqs(lk.a.events) == [s3]
    assert eng.path.unsent == []


def test_cancelled_message_is_not_retransmitted_after_a_reconnect() -> None:
    lk, seqs = delivered_unacked(100, 3)
    assert len(lk.a.engine.cancel_many({seqs[1]})) == 1
    reconnect_with_ack_seq_zero(lk)  # everything unacked but the cancelled one comes again
    assert [f.seq for f in data_frames(lk.b.frames) if f.frag == 0] == [seqs[0], seqs[2]]
    assert lk.a.engine.path.queued_msgs == 0


def test_cancel_many_takes_several_off_at_once_and_forgets_their_rdma() -> None:
    """One ``cancel_many`` for several queued messages: none of them is posted, nor their RDMA ops (objects
    the fake link could not carry out); a sequence number it does not hold is ignored; the others arrive in
    order after the gaps."""
    lk = link()
    lk.connect()
    lk.pump()
    eng = lk.a.engine
    s1 = eng.queue(1, 2, b"one")
    s2 = eng.queue(1, 2, b"two", rdma=object())
    s3 = eng.queue(1, 2, b"three")
    s4 = eng.queue(1, 2, b"four", rdma=object())
    s5 = eng.queue(1, 2, b"five")
    assert [m.seq for m in eng.cancel_many([s4, 999, s2])] == [s2, s4]
    # their ops are forgotten: a later message that reuses a sequence number (after the peer restarted) must
    # never find one
    assert not eng._rdma
    assert eng.path.queued_bytes == 12 and [r.seq for r in eng.path.unsent] == [s1, s3, s5]
    lk.pump()
    assert [(m.header.sequence, m.payload) for m in delivered(lk.b.events)] == [
        (s1, b"one"),
        (s3, b"three"),
        (s5, b"five"),
    ]
    assert all(f.kind is not WrKind.RDMA for f in lk.b.frames)


def test_a_message_after_skipped_sequence_numbers_comes_after_a_sequence_gap_event() -> None:
    """The receiver derives a gap from its own next_rx_seq: the first message after a connect and messages
    that follow on (a ping's sequence number included) bring no SequenceGap; a message after cancelled ones
    (never sent, as a silent op's) is preceded by one."""
    lk = link()
    lk.connect()
    lk.pump()
    eng = lk.a.engine
    eng.queue(1, 2, b"first")
    eng.send_ping(4444)
    eng.queue(1, 2, b"after the ping")
    lk.pump()
    assert not [e for e in lk.b.events if isinstance(e, SequenceGap)]
    skipped = [eng.queue(1, 2, b"never sent") for _ in range(2)]
    last = eng.queue(1, 2, b"after the gap")
    eng.cancel_many(skipped)
    before = len(lk.b.events)
    lk.pump()
    new = lk.b.events[before:]
    gap = next(i for i, e in enumerate(new) if isinstance(e, SequenceGap))
    msgs = delivered(new)
    assert [m.header.sequence for m in msgs] == [last]
    assert new.index(msgs[0]) > gap
    assert sum(isinstance(e, SequenceGap) for e in new) == 1


def test_a_silent_message_counts_in_the_ack_required_accounting() -> None:
    """rds_send_xmit does its ACK_REQUIRED accounting when it picks a message, before it decides a silent op's
    message has no SEND: with max_unacked_packets 1 the messages alternate ACK_REQUIRED, and a silent one in
    the middle still takes its turn (it goes out as the RDMA WR alone)."""
    clock = Clock()
    tx = IbEngine(A4, B4, max_unacked_packets=1)
    tx.established(clock.t)
    tx.path.take_cong_map()
    silent = rdma.RdmaOp(write=True, rkey=1, remote_addr=0, nbytes=8, local=[], silent=True)
    tx.queue(1, 2, b"a")
    tx.queue(1, 2, b"", rdma=silent)
    tx.queue(1, 2, b"c")
    tx.queue(1, 2, b"d")
    wrs = tx.poll_send()
    assert [w.kind for w in wrs] == [WrKind.DATA, WrKind.RDMA, WrKind.DATA, WrKind.DATA]
    assert wrs[1].alone and wrs[1].rdma is silent
    flags = [RDSHeader.decode(w.header).flags & HeaderFlag.ACK_REQUIRED for w in wrs if w.kind is WrKind.DATA]
    assert flags == [HeaderFlag.ACK_REQUIRED, HeaderFlag.ACK_REQUIRED, 0]  # a, c (after the silent one), d
