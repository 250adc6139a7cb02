"""The userspace client's per-message Python (issue 10: under TCG every Python frame after a wakeup counts):
a well-formed ``recv``/``recvfrom``/``sendto`` runs no argument-conversion helper and no generator frame.
Bad arguments still get the stdlib's errors (tests/unit/test_args_*.py and below)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

import pyrds


@pytest.fixture
def loop_pair() -> Iterator[tuple[Any, Any, Any]]:
    rx = pyrds.socket("userspace")
    tx = pyrds.socket("userspace")
    try:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        dest = rx.getsockname()
        tx.sendto(b"warm", dest)
        assert rx.recv(100) == b"warm"
        yield rx, tx, dest
    finally:
        rx.close()
        tx.close()


def _frames(call: Any) -> list[str]:
    """The names of the Python functions ``call()`` ran in this thread."""
    names: list[str] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return names


def test_plain_data_calls_run_no_conversion_helper_or_generator(loop_pair: tuple[Any, Any, Any]) -> None:
    rx, tx, dest = loop_pair
    for _ in range(3):
        names = _frames(lambda: tx.sendto(b"x" * 1024, dest))
        names += _frames(lambda: rx.recv(4096))
        tx.sendto(b"y" * 10, dest)
        names += _frames(lambda: rx.recvfrom(4096))
        # a blocking recv that has to wait polls both fds: which one woke it, without a generator
        threading.Timer(0.05, tx.sendto, (b"z", dest)).start()
        names += _frames(lambda: rx.recv(4096))
        for helper in ("c_ssize", "c_int", "_iterable", "<genexpr>"):
            assert helper not in names, names


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1,), ValueError),
        ((1 << 63,), OverflowError),
        ((4096, 1 << 31), OverflowError),
        (("4096",), TypeError),
        ((4096.0,), TypeError),
    ],
)
def test_bad_recv_arguments_keep_the_stdlib_errors(
    loop_pair: tuple[Any, Any, Any], args: tuple[Any, ...], error: type[Exception]
) -> None:
    rx, tx, dest = loop_pair
    for call in (rx.recv, rx.recvfrom):
        with pytest.raises(error):
            call(*args)
    tx.sendto(b"ab", dest)
    assert rx.recv(True) == b"a"  # an index that is not a plain int still converts, as in the stdlib
