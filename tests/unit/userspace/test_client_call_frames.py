"""The userspace client's per-message Python (issue 10: under TCG every Python frame after a wakeup counts):
a well-formed ``recv``/``recvfrom``/``sendto`` runs no argument-conversion helper and no generator frame.
Bad arguments still get the stdlib's errors (below, and tests/unit/userspace/test_args_lifecycle.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.unit.fastcall_check import python_calls_during


def test_plain_data_calls_run_no_conversion_helper_or_generator(loop_pair: tuple[Any, Any, Any]) -> None:
    rx, tx, dest = loop_pair
    for _ in range(3):
        names = python_calls_during(lambda: tx.sendto(b"x" * 1024, dest))
        names += python_calls_during(lambda: rx.recv(4096))
        tx.sendto(b"y" * 10, dest)
        names += python_calls_during(lambda: rx.recvfrom(4096))
        # a blocking recv that has to wait polls both fds: which one woke it, without a generator
        threading.Timer(0.05, tx.sendto, (b"z", dest)).start()
        names += python_calls_during(lambda: rx.recv(4096))
        short = {name.rsplit(".", 1)[-1] for name in names}
        for helper in ("c_ssize", "c_int", "_iterable", "<genexpr>"):
            assert helper not in short, names


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
    for name, call in (("recv", rx.recv), ("recvfrom", rx.recvfrom)):
        with pytest.raises(ValueError, match=f"^negative buffersize in {name}$"):
            call(-5)
    tx.sendto(b"ab", dest)
    assert rx.recv(True) == b"a"  # an index that is not a plain int still converts, as in the stdlib


def test_fileno_runs_no_python_frame_and_follows_close(loop_pair: tuple[Any, Any, Any]) -> None:
    """fileno() is asked for on every wait (selectors, asyncio's sock_*, pyrds stress): the readiness fd's C
    method, -1 once closed, as a stdlib socket's; a subclass's own fileno is kept."""
    from pyrds.userspace.client.socket import RDSSocket

    rx, _tx, _dest = loop_pair
    fd = rx.fileno()
    assert fd >= 0 and python_calls_during(lambda: rx.fileno()) == []
    s = RDSSocket()
    assert s.fileno() >= 0
    s.close()
    assert s.fileno() == -1

    class OwnFileno(RDSSocket):
        def fileno(self) -> int:
            return 4242

    own = OwnFileno()
    try:
        assert own.fileno() == 4242
    finally:
        own.close()
