"""PathEngine used message by message (what RDS/IB needs): next_message, take_cong_map, receive, acked_seq.

The same sequence/retransmit/duplicate rules as the byte-stream calls, checked without TCP.
"""

from __future__ import annotations

from pyrds.constants import RDS_CONG_MAP_BYTES, HeaderFlag
from pyrds.userspace.proto import (
    CongMapReceived,
    DuplicateDropped,
    MessageReceived,
    PathEngine,
    PingReceived,
    RDSHeader,
    cong_map_header,
)


def up(index: int = 0) -> PathEngine:
    eng = PathEngine("10.0.0.1", "10.0.0.2", index)
    eng.connection_made(1.0)
    return eng


def test_next_message_moves_to_the_retransmit_queue_and_acked_seq_releases() -> None:
    eng = up()
    assert eng.take_cong_map() and not eng.take_cong_map()  # due once after connect, then consumed
    s1 = eng.queue(1, 2, b"a")
    s2 = eng.queue(0, 7, b"")  # a pong-like message: counted as a pong until released
    s3 = eng.queue(1, 2, b"ccc")
    got = eng.next_message()
    assert got is not None and got[0].sequence == s1 and got[1] == b"a"
    assert [r.seq for r in eng.unacked] == [s1] and [r.seq for r in eng.unsent] == [s2, s3]
    eng.next_message()
    eng.next_message()
    assert eng.next_message() is None
    assert eng.queued_bytes == 4 and eng.queued_pongs == 1
    assert [m.seq for m in eng.acked_seq(s2)] == [s1, s2]
    assert eng.queued_bytes == 3 and eng.queued_pongs == 0
    assert eng.acked_seq(s2) == []
    assert [m.seq for m in eng.acked_seq(100)] == [s3] and eng.queued_msgs == 0


def test_nothing_leaves_while_down() -> None:
    eng = PathEngine("10.0.0.1", "10.0.0.2")
    eng.queue(1, 2, b"x")
    assert eng.next_message() is None and not eng.take_cong_map()


def test_reconnect_requeues_as_retransmissions_and_ack_seq_releases_them() -> None:
    eng = up()
    seqs = [eng.queue(1, 2, bytes([i])) for i in range(3)]
    for _ in seqs:
        eng.next_message()
    eng.connection_lost(2.0)
    eng.connection_made(3.0)
    assert [r.seq for r in eng.unacked] == seqs  # requeued, not yet resent
    assert [m.seq for m in eng.acked_seq(seqs[0])] == [seqs[0]]  # e.g. the connect private data's ack_seq
    got = eng.next_message()
    assert got is not None and got[0].sequence == seqs[1] and got[0].flags & HeaderFlag.RETRANSMITTED
    fresh = eng.queue(1, 2, b"new")
    eng.next_message()
    got = eng.next_message()
    assert got is not None and got[0].sequence == fresh and not got[0].flags & HeaderFlag.RETRANSMITTED


def test_receive_applies_the_shared_rules() -> None:
    eng = up()
    h = RDSHeader(5, 0, 2, 1, 2)
    assert [type(e) for e in eng.receive(h, b"hi", 1.0)] == [MessageReceived]
    assert eng.next_rx_seq == 6
    assert eng.receive(h.with_flags(HeaderFlag.RETRANSMITTED), b"hi", 1.0) == [DuplicateDropped(5)]
    assert [type(e) for e in eng.receive(h, b"hi", 1.0)] == [MessageReceived]  # not flagged: delivered
    assert [type(e) for e in eng.receive(RDSHeader(7, 0, 0, 9, 0), b"", 1.0)] == [PingReceived]
    assert eng.unsent[-1].dport == 9  # the pong is queued
    cmap = eng.receive(cong_map_header(), bytes(RDS_CONG_MAP_BYTES), 1.0)
    assert [type(e) for e in cmap] == [CongMapReceived] and eng.next_rx_seq == 8


def test_cancel_message_at_a_time() -> None:
    """RDS/IB's use: a message picked by next_message (on the retransmit queue) and cancelled is not
    requeued by a reconnect; one still queued is never returned; an ack beyond both releases the rest."""
    eng = up()
    eng.take_cong_map()
    s1 = eng.queue(1, 2, b"a")
    s2 = eng.queue(1, 2, b"bb")
    s3 = eng.queue(1, 2, b"ccc")
    eng.next_message()
    assert len(eng.cancel_many({s1})) == 1 and len(eng.cancel_many({s2})) == 1
    assert eng.queued_bytes == 3 and eng.unacked == [] and [r.seq for r in eng.unsent] == [s3]
    eng.connection_lost(2.0)
    eng.connection_made(3.0)
    got = eng.next_message()
    assert got is not None and got[0].sequence == s3 and not got[0].flags & HeaderFlag.RETRANSMITTED
    assert eng.next_message() is None
    assert [m.seq for m in eng.acked_seq(s3)] == [s3] and eng.queued_bytes == 0
