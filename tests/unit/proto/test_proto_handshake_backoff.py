"""Path hashing, who-dials rule and reconnect backoff."""

from __future__ import annotations

import ipaddress
import random
from collections import Counter

import pytest

from pyrds.userspace.proto import ReconnectBackoff, is_hs_probe, jhash_1word, path_for_port, should_dial


@pytest.mark.parametrize(
    ("a", "initval", "expected"),
    # Reference values from a C transcription of include/linux/jhash.h (u32 wrap-around arithmetic).
    [
        (0, 0, 0x049396B8),
        (1, 0, 0x72A82A9B),
        (4000, 0, 0xCA590529),
        (4000, 0x12345678, 0x586E0665),
        (65535, 0xFFFFFFFF, 0x855EA287),
    ],
)
def test_jhash_1word_vectors(a: int, initval: int, expected: int) -> None:
    assert jhash_1word(a, initval) == expected


def test_path_for_port() -> None:
    assert path_for_port(4000, 8) == 0xCA590529 & 7
    assert path_for_port(4000, 8, 0x12345678) == 0x586E0665 & 7
    assert path_for_port(4000, 1) == 0
    assert path_for_port(4000, 0) == path_for_port(4000, 8)  # handshake pending: hash over 8
    spread = Counter(path_for_port(p, 8) for p in range(2, 4098))
    assert set(spread) == set(range(8)) and min(spread.values()) > 350
    for bad in (3, 16, -1):
        with pytest.raises(ValueError):
            path_for_port(4000, bad)
    with pytest.raises(ValueError):
        path_for_port(70000, 8)


def test_should_dial_smaller_address_owns() -> None:
    assert should_dial("10.0.0.1", "10.0.0.2")
    assert not should_dial("10.0.0.2", "10.0.0.1")
    assert should_dial("9.255.255.255", "10.0.0.0")  # numeric, not string order
    assert not should_dial("10.0.0.1", "10.0.0.1")
    assert should_dial(ipaddress.ip_address("fd00::1"), "fd00::2")
    assert should_dial(b"\x0a\0\0\x01", b"\x0a\0\0\x02")
    with pytest.raises(ValueError):
        should_dial("10.0.0.1", "fd00::1")


def test_probe_extensions_and_sport_idx() -> None:
    from pyrds.userspace.proto import ExtHeader, peer_sport_idx, probe_exthdrs

    assert probe_exthdrs(8) == (ExtHeader.npaths(8), ExtHeader.sport_idx())  # SPORT_IDX last (6.1 parsing)
    assert probe_exthdrs(1)[0] == ExtHeader.npaths(1)
    assert peer_sport_idx((ExtHeader.npaths(8), ExtHeader.gen_num(3), ExtHeader.sport_idx()))
    assert not peer_sport_idx((ExtHeader.npaths(8),)) and not peer_sport_idx(())


def test_hs_probe() -> None:
    assert is_hs_probe(1, 0) and is_hs_probe(0, 1)
    assert not is_hs_probe(1, 1) and not is_hs_probe(2, 0)


def test_backoff_kernel_schedule() -> None:
    rng = random.Random(42)
    ref = random.Random(42)
    bo = ReconnectBackoff(1, 1000, rng)
    assert bo.next_delay(10.0) == 0.0  # first attempt immediate
    assert bo.next_attempt_at == 10.0 and bo.ceiling_ms == 1
    ceilings = []
    for _ in range(14):
        ceiling = bo.ceiling_ms
        d = bo.next_delay(10.0)
        assert d == ref.randrange(ceiling) / 1000.0
        assert 0 <= d < ceiling / 1000.0
        ceilings.append(bo.ceiling_ms)
    assert ceilings[:10] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    assert ceilings[-1] == 1000
    bo.reset()
    assert bo.next_delay(20.0) == 0.0 and bo.ceiling_ms == 1


def test_backoff_validates() -> None:
    with pytest.raises(ValueError):
        ReconnectBackoff(0, 10)
    with pytest.raises(ValueError):
        ReconnectBackoff(10, 5)
