"""Frame-level rules of RDS/IB: fragments, ACK-only frames, the checksum, and every malformed receive."""

from __future__ import annotations

import dataclasses
import ipaddress
import random
import struct

import pytest

from pyrds.constants import RDS_HEADER_SIZE, HeaderFlag
from pyrds.userspace.proto import MessageReceived, PathState, ProtocolError, RDSHeader
from pyrds.userspace.proto.header import checksum_ok, header_checksum, with_checksum
from pyrds.userspace.transports.ib.engine import IbEngine
from pyrds.userspace.transports.ib.events import IbEvent, MessagesAcked
from pyrds.userspace.transports.ib.frag import ack_frame, frag_count, fragments, sealed_header
from pyrds.userspace.transports.ib.wire import RDS_FRAG_SIZE, WcOpcode

A4 = ipaddress.IPv4Address("10.0.0.1")
B4 = ipaddress.IPv4Address("10.0.0.2")


@pytest.mark.parametrize(
    ("length", "count"), [(0, 1), (1, 1), (4096, 1), (4097, 2), (8192, 2), (65536, 16), (1 << 20, 256)]
)
def test_frag_count(length: int, count: int) -> None:
    assert frag_count(length) == count
    pieces = fragments(bytes(length))
    assert len(pieces) == count and sum(map(len, pieces)) == length
    assert all(len(p) == RDS_FRAG_SIZE for p in pieces[:-1])


def test_checksum_matches_a_little_endian_kernel_and_verifies() -> None:
    raw = RDSHeader(7, 3, 4097, 4000, 5000, HeaderFlag.ACK_REQUIRED, 2).encode()
    sealed = with_checksum(raw)
    # x86: ip_fast_csum sums native (little-endian) 16-bit words and stores the result natively
    total = sum(struct.unpack("<24H", raw))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    assert sealed[30:32] == (~total & 0xFFFF).to_bytes(2, "little")
    # the sum over the sealed header, checksum included, is all ones
    total = sum(struct.unpack(">24H", sealed))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    assert total == 0xFFFF
    assert checksum_ok(sealed) and checksum_ok(raw)  # 0 = no checksum
    assert header_checksum(sealed) == int.from_bytes(sealed[30:32], "big")
    for i in list(range(30)) + list(range(32, 48)):
        bad = bytearray(sealed)
        bad[i] ^= 0x10
        assert not checksum_ok(bad)


def test_ack_only_frame_bytes() -> None:
    frame = ack_frame(0x1122334455667788)
    h = RDSHeader.decode(frame)
    assert len(frame) == RDS_HEADER_SIZE and checksum_ok(frame) and h.csum != 0
    assert (h.sequence, h.ack, h.length, h.sport, h.dport, h.flags, h.credit) == (
        0,
        0x1122334455667788,
        0,
        0,
        0,
        0,
        0,
    )


# -- the receive side ---------------------------------------------------------------------------------------
def rx_engine() -> IbEngine:
    eng = IbEngine(B4, A4)
    eng.established(1.0)
    return eng


def frame(
    seq: int,
    length: int,
    data: bytes,
    *,
    sport: int = 1,
    dport: int = 2,
    ack: int = 0,
    flags: int = 0,
    seal: bool = True,
) -> bytes:
    raw = RDSHeader(seq, ack, length, sport, dport, flags).encode()
    return (with_checksum(raw) if seal else raw) + data


def drop(eng: IbEngine, data: bytes, reason: str, opcode: int = WcOpcode.RECV) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        eng.recv_complete(data, 2.0, opcode)
    assert info.value.reason == reason
    assert eng.state == PathState.DOWN and eng.drop_reason.startswith(reason)
    assert eng.counters["ib_protocol_error"] == 1 and eng.counters[f"ib_drop_{reason}"] == 1
    assert eng.recv_complete(data, 3.0) == []  # flushed completions after the drop are ignored
    return info.value


def delivered(events: list[IbEvent]) -> list[bytes]:
    return [e.payload for e in events if isinstance(e, MessageReceived)]


@pytest.mark.parametrize("n", [0, 1, 20, 47])
def test_short_frame_drops(n: int) -> None:
    drop(rx_engine(), bytes(n), "short_frame")


def test_bad_checksum_drops_and_zero_checksum_is_none() -> None:
    good = frame(1, 3, b"abc")
    bad = bytearray(good)
    bad[5] ^= 1
    eng = rx_engine()
    drop(eng, bytes(bad), "bad_checksum")
    assert eng.counters["recv_drop_bad_checksum"] == 1
    assert delivered(rx_engine().recv_complete(frame(1, 3, b"abc", seal=False), 2.0)) == [b"abc"]


@pytest.mark.parametrize("change", [{"seq": 2}, {"length": 8193}, {"sport": 9}, {"dport": 9}])
def test_fragment_header_mismatch_drops(change: dict[str, int]) -> None:
    eng = rx_engine()
    assert eng.recv_complete(frame(1, 8192, bytes(4096)), 2.0) == []
    args = {"seq": 1, "length": 8192, "sport": 1, "dport": 2, **change}
    later = frame(args["seq"], args["length"], bytes(4096), sport=args["sport"], dport=args["dport"])
    drop(eng, later, "frag_mismatch")


def test_fragments_may_differ_in_h_ack_and_ack_only_frames_may_interleave() -> None:
    eng = rx_engine()
    events = eng.recv_complete(frame(5, 8192, bytes(4096), ack=0), 2.0)
    events += eng.recv_complete(ack_frame(0), 2.0)
    events += eng.recv_complete(frame(5, 8192, b"\1" * 4096, ack=9), 2.0)
    assert delivered(events) == [bytes(4096) + b"\1" * 4096]
    assert eng.counters["ib_ack_received"] == 1 and eng.ack_next == 5


@pytest.mark.parametrize(("first", "second"), [(100, None), (4096, 4095), (4095, None)])
def test_short_fragment_drops(first: int, second: int | None) -> None:
    eng = rx_engine()
    if second is None:
        drop(eng, frame(1, 8000, bytes(first)), "short_frag")
    else:
        eng.recv_complete(frame(1, 8192, bytes(first)), 2.0)
        drop(eng, frame(1, 8192, bytes(second)), "short_frag")


def test_exact_last_fragment_and_trailing_bytes() -> None:
    eng = rx_engine()
    eng.recv_complete(frame(1, 5000, bytes(4096)), 2.0)
    assert delivered(eng.recv_complete(frame(1, 5000, b"\2" * 904), 2.0)) == [bytes(4096) + b"\2" * 904]
    # bytes past h_len in the last fragment are not delivered (the kernel copies h_len bytes)
    assert delivered(eng.recv_complete(frame(2, 3, b"abcdef"), 2.0)) == [b"abc"]


def test_other_limits_drop() -> None:
    drop(rx_engine(), frame(1, 0, b""), "bad_opcode", WcOpcode.RECV_RDMA_WITH_IMM)
    drop(rx_engine(), frame(1, (1 << 20) + 1, bytes(4096)), "msg_too_long")
    drop(rx_engine(), frame(1, 8192, bytes(4097)), "long_frame")


def test_h_ack_of_a_bad_frame_still_reported_in_partial() -> None:
    sender = IbEngine(B4, A4)
    sender.established(1.0)
    sender.queue(1, 2, b"x")
    sender.poll_send()
    sender.recv_complete(frame(1, 8192, bytes(4096)), 2.0)
    with pytest.raises(ProtocolError) as info:
        sender.recv_complete(frame(2, 8192, bytes(4096), ack=1), 2.0)
    assert info.value.reason == "frag_mismatch"
    assert [m.seq for e in info.value.partial if isinstance(e, MessagesAcked) for m in e.messages] == [1]


def test_h_credit_is_recorded() -> None:
    eng = rx_engine()
    raw = dataclasses.replace(RDSHeader(1, 0, 0, 1, 2), credit=7)
    eng.recv_complete(sealed_header(raw), 2.0)
    assert eng.credits_received == 7


def test_fuzz_the_receive_side() -> None:
    """Random and mutated completions: a ProtocolError (drop + counter) or events, never anything else."""
    rng = random.Random(0x1B)
    eng = rx_engine()
    reasons: set[str] = set()
    ok = 0
    for i in range(5000):
        kind = i % 3
        if kind == 0:
            data = rng.randbytes(rng.choice([rng.randrange(0, 64), rng.randrange(0, 4300)]))
        else:
            length = rng.choice([0, 1, 100, 4096, 4097, 8192, 20000, rng.randrange(0, 1 << 21)])
            header = RDSHeader(
                rng.randrange(0, 6),
                rng.randrange(0, 6),
                length,
                rng.choice([0, 1, 2]),
                rng.choice([0, 1, 2]),
                rng.choice([0, 1, 2, 4, 6, rng.randrange(256)]),
                rng.randrange(0, 3),
            )
            raw = bytearray(header.encode())
            if rng.random() < 0.3:
                raw[rng.randrange(RDS_HEADER_SIZE)] = rng.randrange(256)
            body = rng.randbytes(rng.choice([0, min(length, 4096), rng.randrange(0, 4200)]))
            data = (with_checksum(bytes(raw)) if kind == 1 else bytes(raw)) + body
        try:
            eng.recv_complete(
                data, float(i), rng.choice([WcOpcode.RECV] * 20 + [WcOpcode.RECV_RDMA_WITH_IMM])
            )
            ok += 1
        except ProtocolError as exc:
            reasons.add(exc.reason)
            assert eng.state == PathState.DOWN
            eng.established(float(i))
        eng.poll_send()
    assert ok > 500
    assert {
        "short_frame",
        "bad_checksum",
        "frag_mismatch",
        "short_frag",
        "long_frame",
        "bad_opcode",
    } <= reasons
    assert (
        sum(v for k, v in eng.counters.items() if k.startswith("ib_drop_"))
        == eng.counters["ib_protocol_error"]
    )
