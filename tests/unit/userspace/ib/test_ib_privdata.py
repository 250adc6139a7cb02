"""rds_ib_connect_private (IPv4 32 bytes, IPv6 56 bytes), the passive version decision, REJ data."""

from __future__ import annotations

import ipaddress
import random

import pytest

from pyrds.userspace.proto import PathState, ProtocolError
from pyrds.userspace.transports.ib.engine import IbEngine
from pyrds.userspace.transports.ib.privdata import (
    PROTOCOL_3_1,
    PROTOCOL_4_0,
    PROTOCOL_4_1,
    REJ_CONSUMER_DATA,
    ConnectPrivate,
    negotiate,
    propose,
    reply_version,
)

A4 = ipaddress.IPv4Address("10.0.0.1")
B4 = ipaddress.IPv4Address("10.0.0.2")
A6 = ipaddress.IPv6Address("fd00::1")
B6 = ipaddress.IPv6Address("fd00::2")

CMN = bytes.fromhex("03 01 0003 05 000000 0102030405060708 0a0b0c0d 00000000")
V4 = bytes.fromhex("0a000001 0a000002") + CMN
V6 = A6.packed + B6.packed + CMN


def sample(v6: bool) -> ConnectPrivate:
    s, d = (A6, B6) if v6 else (A4, B4)
    return ConnectPrivate(s, d, 3, 1, 0x0003, 5, 0x0102030405060708, 0x0A0B0C0D)


@pytest.mark.parametrize(("v6", "wire"), [(False, V4), (True, V6)])
def test_layout_is_the_kernels(v6: bool, wire: bytes) -> None:
    assert len(wire) == (56 if v6 else 32) == ConnectPrivate.size(v6)
    assert sample(v6).pack() == wire
    assert ConnectPrivate.parse(wire, ipv6=v6) == sample(v6)


@pytest.mark.parametrize(("v6", "wire"), [(False, V4), (True, V6)])
@pytest.mark.parametrize("area", [56, 148, 196])
def test_the_zero_padded_cm_area_is_accepted(v6: bool, wire: bytes, area: int) -> None:
    assert ConnectPrivate.parse(wire.ljust(area, b"\0"), ipv6=v6) == sample(v6)


@pytest.mark.parametrize(("v6", "wire"), [(False, V4), (True, V6)])
def test_truncated_or_extended_private_data_is_a_value_error(v6: bool, wire: bytes) -> None:
    for cut in range(len(wire)):
        with pytest.raises(ValueError):
            ConnectPrivate.parse(wire[:cut], ipv6=v6)
    with pytest.raises(ValueError):
        ConnectPrivate.parse(wire.ljust(197, b"\0"), ipv6=v6)


def test_ipv6_data_parsed_as_ipv4_reads_the_first_32_bytes_only() -> None:
    got = ConnectPrivate.parse(V6, ipv6=False)  # the listener decides, never the bytes
    assert got.saddr == ipaddress.IPv4Address("253.0.0.0") and got.major == 0


def test_what_a_peer_proposes() -> None:
    p = propose(A4, B4, ack_seq=77)
    assert (p.saddr, p.daddr, p.major, p.minor, p.minor_mask, p.tos, p.ack_seq, p.credit) == (
        A4,
        B4,
        3,
        1,
        0x0003,
        0,
        77,
        0,
    )


@pytest.mark.parametrize(
    ("data_len", "major", "minor", "mask", "want"),
    [
        (0, 3, 1, 3, 0),  # no private data: reject
        (56, 0, 0, 0, PROTOCOL_4_0),  # an old peer without version: 4.0
        (56, 0, 7, 0xFFFF, PROTOCOL_4_0),
        (56, 4, 1, 0x0003, PROTOCOL_4_1),
        (56, 4, 0, 0x0001, PROTOCOL_4_0),
        (56, 4, 9, 0x0002, PROTOCOL_4_1),
        (56, 4, 1, 0x0007, PROTOCOL_4_1),  # the highest *common* bit
        (56, 4, 1, 0x0000, 0),  # 4.x with an empty mask: reject
        (56, 4, 1, 0x0004, 0),
        (56, 3, 1, 0x0000, PROTOCOL_3_1),
        (56, 3, 1, 0x0003, PROTOCOL_3_1),
        (56, 3, 0, 0x0003, 0),  # 3.0: reject
        (56, 2, 0, 0x0003, 0),
        (56, 5, 0, 0x0003, 0),
    ],
)
def test_passive_version_decision(data_len: int, major: int, minor: int, mask: int, want: int) -> None:
    assert negotiate(data_len, major, minor, mask) == want


def test_rej_consumer_data_is_little_endian_int_1() -> None:
    assert REJ_CONSUMER_DATA == b"\x01\x00\x00\x00"


def test_reply_version() -> None:
    assert reply_version(sample(False)) == PROTOCOL_3_1
    rep0 = ConnectPrivate(A4, B4, 0, 0)
    assert reply_version(rep0) == PROTOCOL_4_1  # major 0: keep the local c_version
    with pytest.raises(ValueError):
        reply_version(ConnectPrivate(A4, B4, 3, 0))


def test_field_ranges_are_checked_on_pack() -> None:
    with pytest.raises(ValueError):
        ConnectPrivate(A4, B4, ack_seq=1 << 64)
    with pytest.raises(ValueError):
        ConnectPrivate(A4, B6)


# -- the engine's connection setup -----------------------------------------------------------------------
def test_active_and_passive_engines_agree() -> None:
    a, b = IbEngine(A4, B4), IbEngine(B4, A4)
    req = a.connect(1.0)
    assert a.state == PathState.CONNECTING
    assert ConnectPrivate.parse(req, ipv6=False) == propose(A4, B4)
    answer = b.on_request(req.ljust(56, b"\0"), 1.0)
    assert answer.accept and b.state == PathState.CONNECTING and b.version == PROTOCOL_3_1
    rep = ConnectPrivate.parse(answer.private_data, ipv6=False)
    assert (rep.saddr, rep.daddr, rep.major, rep.minor, rep.minor_mask) == (B4, A4, 3, 1, 3)
    b.established(1.0)
    a.on_reply(answer.private_data.ljust(196, b"\0"), 1.0)
    assert a.state == b.state == PathState.UP and a.version == PROTOCOL_3_1


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (V4[:31], "bad_private_data"),  # truncated
        (V4.ljust(197, b"\0"), "bad_private_data"),  # longer than any CM area
        (b"", "bad_private_data"),
        (bytes.fromhex("0a000002 0a000001") + bytes([3, 0]) + CMN[2:], "incompatible version 3.0"),
        (bytes.fromhex("0a000002 0a000001") + bytes([4, 1, 0, 0]) + CMN[4:], "incompatible version 4.1"),
        (bytes.fromhex("0a000009 0a000001") + CMN, "not this conn"),  # addresses of another connection
    ],
)
def test_bad_requests_are_rejected_with_the_kernels_rej_data_and_counted(data: bytes, why: str) -> None:
    b = IbEngine(B4, A4)
    answer = b.on_request(data, 1.0)
    assert not answer.accept and answer.private_data == REJ_CONSUMER_DATA and why in answer.reason
    assert b.counters["ib_bad_private_data"] == 1 and b.state == PathState.DOWN


def test_request_while_up_drops_the_stale_connection_and_while_connecting_is_a_race() -> None:
    b = IbEngine(B4, A4)
    b.established(1.0)
    req = propose(A4, B4).pack()
    assert not b.on_request(req, 2.0).accept and b.state == PathState.DOWN
    assert b.counters["ib_listen_closed_stale"] == 1
    b.connect(3.0)
    assert not b.on_request(req, 3.0).accept and b.state == PathState.CONNECTING
    assert b.counters["ib_connect_raced"] == 1


@pytest.mark.parametrize("rep", [V4[:20], ConnectPrivate(B4, A4, 3, 0).pack(), b""])
def test_bad_reply_drops_the_attempt(rep: bytes) -> None:
    a = IbEngine(A4, B4)
    a.connect(1.0)
    with pytest.raises(ProtocolError) as info:
        a.on_reply(rep, 1.0)
    assert info.value.reason == "bad_private_data"
    assert a.state == PathState.DOWN and a.counters["ib_bad_private_data"] == 1
    assert a.counters["ib_drop_bad_private_data"] == 1


def test_fuzz_private_data_parser_and_request_handler() -> None:
    rng = random.Random(0x1B9)
    b4, b6 = IbEngine(B4, A4), IbEngine(B6, A6)
    accepted = 0
    for i in range(4000):
        kind = i % 4
        if kind == 0:
            data = rng.randbytes(rng.randrange(0, 240))
        else:  # mutate a valid one: flip bytes, cut or extend
            base = bytearray(
                (V6 if kind == 3 else propose(A4, B4).pack()).ljust(rng.choice([0, 56, 196]), b"\0")
            )
            for _ in range(rng.randrange(0, 4)):
                if base:
                    base[rng.randrange(len(base))] = rng.randrange(256)
            data = bytes(base[: rng.randrange(0, len(base) + 1)]) if rng.random() < 0.3 else bytes(base)
        for v6 in (False, True):
            try:
                ConnectPrivate.parse(data, ipv6=v6)
            except ValueError:
                pass
        for eng in (b4, b6):
            answer = eng.on_request(data, float(i))
            if answer.accept:
                accepted += 1
                eng.established(float(i))
                eng.connection_lost(float(i))
            else:
                assert answer.private_data == REJ_CONSUMER_DATA
    assert accepted > 0
