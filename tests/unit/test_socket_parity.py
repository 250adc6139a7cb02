"""RDSSocketBase's generic stdlib parity on the userspace backend (this host): the exceptions and messages
as a stdlib SOCK_SEQPACKET socket for bad recv_into/recvfrom_into arguments, and the stdlib's attributes."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

import pyrds

BAD = [
    (bytearray(4), 5),
    (bytearray(4), -1),
    (b"read-only",),
    ("text",),
    (bytearray(4), 1.5),
    (bytearray(4), True),  # a bool is an int to the stdlib: a non-blocking read of 1 byte -> EAGAIN
    (memoryview(b"abc"),),
]


@pytest.fixture
def pair() -> Iterator[tuple[Any, socket.socket]]:
    rds = pyrds.socket("userspace")
    rds.bind(("127.0.0.1", 0))
    rds.setblocking(False)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.setblocking(False)
    yield rds, b
    rds.close()
    a.close()
    b.close()


def _outcome(fn: Any, args: tuple[Any, ...]) -> tuple[str, str]:
    try:
        return "returned", repr(fn(*args))
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("method", ["recv_into", "recvfrom_into"])
@pytest.mark.parametrize("args", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_arguments_like_the_stdlib(pair: tuple[Any, socket.socket], method: str, args: Any) -> None:
    rds, std = pair
    expected = _outcome(getattr(std, method), args)
    got = _outcome(getattr(rds, method), args)
    if expected[0] == "BlockingIOError":  # same exception; the strerror detail may differ
        assert got[0] == "BlockingIOError", got
    else:
        assert got == expected


def test_attributes_and_dup_on_userspace() -> None:
    with pyrds.socket("userspace") as s:
        assert (s.family, s.type, s.proto) == (socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
        assert repr(s).startswith(
            f"<pyrds.userspace.client.RDSSocket fd={s.fileno()}, family=21, type=5, proto=0"
        )
        with pytest.raises(OSError) as info:
            s.dup()
        assert info.value.errno == 95
        with pytest.raises(OSError):
            s.detach()
        assert s.fileno() >= 0  # a failed detach leaves the socket usable
