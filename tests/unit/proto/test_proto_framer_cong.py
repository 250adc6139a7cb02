"""MessageFramer and congestion maps."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrds.constants import RDS_CONG_MAP_BYTES, RDS_HEADER_SIZE, RDS_MAX_MSG_SIZE
from pyrds.userspace.proto import (
    CongestionMap,
    MessageFramer,
    ProtocolError,
    RDSHeader,
    encode_cong_map_message,
    is_congested,
    is_uncongested,
    next_congested_state,
)


def _msg(seq: int, payload: bytes, dport: int = 5) -> bytes:
    return RDSHeader(sequence=seq, length=len(payload), sport=4, dport=dport).encode() + payload


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


def test_one_byte_at_a_time() -> None:
    stream = _msg(1, b"hello") + _msg(2, b"") + _msg(3, b"x" * 300)
    f = MessageFramer()
    frames = []
    for i in range(len(stream)):
        frames += f.feed(stream[i : i + 1])
        assert f.buffered <= RDS_HEADER_SIZE + 300
    assert [(fr.header.sequence, fr.payload) for fr in frames] == [(1, b"hello"), (2, b""), (3, b"x" * 300)]
    assert f.hdr_rem == RDS_HEADER_SIZE and f.data_rem == 0 and f.buffered == 0


@given(
    st.lists(st.binary(max_size=200), min_size=1, max_size=20),
    st.lists(st.integers(0, 10_000), max_size=30),
)
def test_any_chunking_gives_same_messages(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(_msg(i + 1, p) for i, p in enumerate(payloads))
    f = MessageFramer()
    got = []
    for chunk in _chunks(stream, cuts):
        got += f.feed(chunk)
    assert [fr.payload for fr in got] == payloads
    assert [fr.header.sequence for fr in got] == list(range(1, len(payloads) + 1))


def test_partial_state_counters() -> None:
    f = MessageFramer()
    data = _msg(1, b"abcdef")
    assert f.feed(data[:10]) == []
    assert f.hdr_rem == 38
    assert f.feed(data[10:50]) == []
    assert f.hdr_rem == 0 and f.data_rem == 4


def test_max_size_accepted_and_one_more_rejected() -> None:
    f = MessageFramer()
    hdr = RDSHeader(sequence=1, length=RDS_MAX_MSG_SIZE).encode()
    assert f.feed(hdr) == []
    out = f.feed(b"\0" * RDS_MAX_MSG_SIZE)
    assert len(out) == 1 and len(out[0].payload) == RDS_MAX_MSG_SIZE
    with pytest.raises(ProtocolError) as ei:
        f.feed(RDSHeader(sequence=2, length=RDS_MAX_MSG_SIZE + 1).encode())
    assert ei.value.reason == "msg_too_long"
    with pytest.raises(ProtocolError):  # stays failed
        f.feed(_msg(3, b"ok"))


def test_error_after_good_messages_keeps_them() -> None:
    f = MessageFramer(max_len=10)
    out = f.feed(_msg(1, b"ok") + RDSHeader(sequence=2, length=11).encode())
    assert [fr.payload for fr in out] == [b"ok"]
    assert f.error is not None and f.error.reason == "msg_too_long"
    with pytest.raises(ProtocolError):
        f.feed(b"")


@settings(max_examples=200)
@given(st.lists(st.binary(max_size=300), max_size=30), st.integers(0, 4096))
def test_garbage_only_protocol_error_and_bounded(chunks: list[bytes], max_len: int) -> None:
    f = MessageFramer(max_len=max_len)
    try:
        for c in chunks:
            f.feed(c)
            assert f.buffered <= RDS_HEADER_SIZE + max_len
    except ProtocolError as exc:
        assert exc.reason == "msg_too_long"


def test_cong_bit_layout_lsb_first() -> None:
    m = CongestionMap()
    for p in (0, 9, 15, 65535):
        m.set(p)
    raw = m.to_bytes()
    assert len(raw) == RDS_CONG_MAP_BYTES
    assert raw[0] == 0x01 and raw[1] == 0x82 and raw[8191] == 0x80
    assert sum(raw) == 0x01 + 0x82 + 0x80
    assert m.test(9) and not m.test(8)
    m.clear(9)
    assert not m.test(9) and m.to_bytes()[1] == 0x80
    with pytest.raises(ValueError):
        m.set(65536)


def test_cong_round_trip_and_wrong_length() -> None:
    m = CongestionMap()
    m.set(4000)
    m2 = CongestionMap.from_bytes(m.to_bytes())
    assert m2 == m and m2.ports() == [4000]
    for n in (0, 8191, 8193):
        with pytest.raises(ProtocolError) as ei:
            CongestionMap.from_bytes(b"\0" * n)
        assert ei.value.reason == "bad_cong_map_len"


@given(st.sets(st.integers(0, 65535), max_size=40), st.sets(st.integers(0, 65535), max_size=40))
def test_changed_ports(a: set[int], b: set[int]) -> None:
    ma, mb = CongestionMap(), CongestionMap()
    for p in a:
        ma.set(p)
    for p in b:
        mb.set(p)
    assert CongestionMap.changed_ports(ma, mb) == sorted(a ^ b)


def test_cong_message_vector() -> None:
    m = CongestionMap()
    m.set(1)
    raw = encode_cong_map_message(m)
    expected_hdr = struct.pack(">QQIHHBB4sH16s", 0, 0, 8192, 0, 0, 0x01, 0, b"", 0, b"")
    assert raw[:48] == expected_hdr
    assert raw[48:] == b"\x02" + b"\0" * 8191


def test_congestion_thresholds_match_rcvbuf_delta() -> None:
    rcvbuf = 1000  # SO_RCVBUF as reported (doubled); rds_sk_rcvbuf = 500
    assert not is_congested(500, rcvbuf)
    assert is_congested(501, rcvbuf)
    assert is_uncongested(249, rcvbuf) and not is_uncongested(250, rcvbuf)
    assert next_congested_state(False, 501, rcvbuf) is True
    assert next_congested_state(True, 400, rcvbuf) is True  # hysteresis
    assert next_congested_state(True, 249, rcvbuf) is False
    assert next_congested_state(False, 400, rcvbuf) is False
