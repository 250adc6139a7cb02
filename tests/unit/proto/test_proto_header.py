"""struct rds_header and extension header codec."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrds.constants import RDS_HEADER_SIZE, ExtHeaderType, HeaderFlag
from pyrds.userspace.proto import ExtHeader, ProtocolError, RDSHeader, decode_exthdrs, encode_exthdrs


def test_wire_vector_pinned() -> None:
    h = RDSHeader(
        sequence=0x0102030405060708,
        ack=0x1112131415161718,
        length=5,
        sport=4000,
        dport=4001,
        flags=HeaderFlag.RETRANSMITTED,
        credit=7,
        csum=0xBEEF,
        exthdr=(ExtHeader.npaths(8),),
    )
    expected = (
        struct.pack(">Q", 0x0102030405060708)
        + struct.pack(">Q", 0x1112131415161718)
        + struct.pack(">I", 5)
        + struct.pack(">H", 4000)
        + struct.pack(">H", 4001)
        + bytes([0x04, 7])
        + b"\0\0\0\0"
        + struct.pack(">H", 0xBEEF)
        + bytes([5])
        + struct.pack(">H", 8)
        + b"\0" * 13
    )
    assert len(expected) == RDS_HEADER_SIZE == 48
    assert h.encode() == expected
    assert RDSHeader.decode(expected) == h


def test_offsets_of_each_field() -> None:
    raw = RDSHeader(sequence=1, length=0x0A0B0C0D, sport=0x1234, dport=0x5678, flags=0x02).encode()
    assert raw[7] == 1
    assert raw[16:20] == b"\x0a\x0b\x0c\x0d"
    assert raw[20:22] == b"\x12\x34"
    assert raw[22:24] == b"\x56\x78"
    assert raw[24] == 0x02
    assert raw[32:48] == b"\0" * 16


def test_short_header_is_protocol_error() -> None:
    with pytest.raises(ProtocolError) as ei:
        RDSHeader.decode(b"\0" * 47)
    assert ei.value.reason == "short_header"
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("field", ["sequence", "ack", "length", "sport", "dport", "flags", "credit", "csum"])
def test_out_of_range_field_rejected(field: str) -> None:
    with pytest.raises(ValueError):
        RDSHeader(**{field: 1 << 64}).encode()  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RDSHeader(**{field: -1}).encode()  # type: ignore[arg-type]


def test_exthdr_sizes_and_values() -> None:
    assert ExtHeader.version(0x0401).values == (0x0401,)
    assert ExtHeader.rdma(0xDEAD).body == b"\0\0\xde\xad"
    assert ExtHeader.rdma_dest(1, 2).values == (1, 2)
    assert ExtHeader.gen_num(9).type == ExtHeaderType.GEN_NUM
    with pytest.raises(ValueError):
        ExtHeader(ExtHeaderType.NPATHS, b"\0")  # wrong body size
    with pytest.raises(ValueError):
        ExtHeader(16)
    with pytest.raises(ValueError):
        ExtHeader(0)


def test_decode_stops_at_none_and_at_type_16_or_more() -> None:
    area = bytes([5, 0, 8, 0, 1, 0, 0, 0, 1]) + b"\0" * 7
    assert decode_exthdrs(area) == (ExtHeader.npaths(8),)
    area = bytes([16, 5, 0, 8]) + b"\0" * 12
    assert decode_exthdrs(area) == ()
    area = bytes([6, 0, 0, 0, 3, 0xFF]) + b"\0" * 10
    assert decode_exthdrs(area) == (ExtHeader.gen_num(3),)


def test_sport_idx_has_a_one_byte_body() -> None:
    assert ExtHeaderType.SPORT_IDX == 8
    assert ExtHeader.sport_idx() == ExtHeader(8, b"\0") and ExtHeader.sport_idx().values == (0,)
    with pytest.raises(ValueError):
        ExtHeader(ExtHeaderType.SPORT_IDX)  # 0 bytes is the 6.1 size, not 7.x's


def test_decode_7x_probe_area() -> None:
    """rds_send_probe on 7.x: NPATHS(5) be16 8, GEN_NUM(6) be32, SPORT_IDX(8) 0x00."""
    area = bytes([5, 0, 8, 6, 0xDE, 0xAD, 0xBE, 0xEF, 8, 0]) + b"\0" * 6
    assert decode_exthdrs(area) == (ExtHeader.npaths(8), ExtHeader.gen_num(0xDEADBEEF), ExtHeader.sport_idx())
    assert encode_exthdrs(decode_exthdrs(area)) == area


def decode_like_6_1(area: bytes) -> list[tuple[int, bytes]]:
    """rds_message_next_extension with 6.1's rds_exthdr_size (no entry for 8: size 0)."""
    sizes = {1: 4, 2: 4, 3: 8, 5: 2, 6: 4}
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos < 16:
        t = area[pos]
        pos += 1
        if t == 0 or t >= 16 or pos + sizes.get(t, 0) > 16:
            break
        out.append((t, area[pos : pos + sizes.get(t, 0)]))
        pos += sizes.get(t, 0)
    return out


def test_our_probe_extensions_parse_on_6_1() -> None:
    """SPORT_IDX last: 6.1 sees NPATHS, an empty unknown type 8 (ignored with a warning), then the 0x00 body
    ends the list."""
    from pyrds.userspace.proto import probe_exthdrs

    area = encode_exthdrs(probe_exthdrs(8))
    assert area[:5] == bytes([5, 0, 8, 8, 0])
    assert decode_like_6_1(area) == [(5, b"\0\x08"), (8, b"")]
    assert decode_exthdrs(area) == (ExtHeader.npaths(8), ExtHeader.sport_idx())


def test_decode_unlisted_type_is_zero_length_like_kernel() -> None:
    # rds_exthdr_size[4] == 0: the kernel yields type 4 with no body and keeps going.
    area = bytes([4, 5, 0, 2]) + b"\0" * 12
    assert decode_exthdrs(area) == (ExtHeader(4), ExtHeader.npaths(2))


def test_decode_overrun_ends_list() -> None:
    # RDMA_DEST (8-byte body) starting at offset 8 needs 17 bytes: ignored, like the kernel.
    area = bytes([5, 0, 1, 6, 0, 0, 0, 9]) + bytes([3]) + b"\1" * 7
    assert decode_exthdrs(area) == (ExtHeader.npaths(1), ExtHeader.gen_num(9))


def test_encode_too_many_extensions_rejected() -> None:
    with pytest.raises(ValueError):
        encode_exthdrs([ExtHeader.rdma_dest(1, 2), ExtHeader.rdma_dest(3, 4)])


ext_strategy = st.one_of(
    st.integers(0, 0xFFFF).map(ExtHeader.npaths),
    st.integers(0, 0xFFFFFFFF).map(ExtHeader.gen_num),
    st.builds(lambda: ExtHeader.sport_idx()),
    st.integers(0, 0xFFFFFFFF).map(ExtHeader.version),
    st.integers(0, 0xFFFFFFFF).map(ExtHeader.rdma),
    st.tuples(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF)).map(lambda t: ExtHeader.rdma_dest(*t)),
)

headers = st.builds(
    RDSHeader,
    sequence=st.integers(0, 2**64 - 1),
    ack=st.integers(0, 2**64 - 1),
    length=st.integers(0, 2**32 - 1),
    sport=st.integers(0, 0xFFFF),
    dport=st.integers(0, 0xFFFF),
    flags=st.integers(0, 0xFF),
    credit=st.integers(0, 0xFF),
    csum=st.integers(0, 0xFFFF),
    exthdr=st.lists(ext_strategy, max_size=3)
    .filter(lambda xs: sum(1 + len(x.body) for x in xs) <= 16)
    .map(tuple),
)


@given(headers)
def test_header_round_trip(h: RDSHeader) -> None:
    raw = h.encode()
    assert len(raw) == 48
    assert RDSHeader.decode(raw) == h
    assert RDSHeader.decode(raw).encode() == raw


@given(st.binary(min_size=48, max_size=48))
def test_any_48_bytes_decode(raw: bytes) -> None:
    h = RDSHeader.decode(raw)
    assert h.encode()[:32] == raw[:26] + b"\0\0\0\0" + raw[30:32]


def test_examples_have_no_deadline() -> None:
    """The package's conftest turns hypothesis's per-example deadline off (a busy machine is no failure)."""
    from hypothesis import settings

    assert settings.default is not None and settings.default.deadline is None
