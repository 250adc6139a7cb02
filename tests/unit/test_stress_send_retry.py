"""``pyrds stress``'s sender: a full send queue is waited out on POLLOUT with no sleep; a congested peer
(ENOBUFS, which POLLOUT does not show) backs off; both are counted in the summary's send_waits."""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import pytest

from pyrds.cli import stress_proto
from pyrds.cli.stress_proto import SendWaits, send_retry


class Refusing:
    """A socket whose sendto raises the given errors, then succeeds."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.sent = 0

    def sendto(self, data: bytes, addr: Any) -> int:
        if self.errors:
            e = self.errors.pop(0)
            if e == errno.EAGAIN:
                raise BlockingIOError(e, "full")
            raise OSError(e, "refused")
        self.sent += 1
        return len(data)

    def fileno(self) -> int:
        return 0


@pytest.fixture
def writable(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """wait_fd says writable at once; the sleeps send_retry makes are recorded."""
    slept: list[float] = []
    monkeypatch.setattr(stress_proto, "wait_fd", lambda sock, events, timeout: True)
    monkeypatch.setattr(stress_proto.time, "sleep", slept.append)
    return slept


def test_a_full_send_queue_is_retried_on_pollout_without_sleeping(writable: list[float]) -> None:
    sock, waits = Refusing(errno.EAGAIN), SendWaits()
    send_retry(sock, b"x", ("10.0.0.1", 1), time.monotonic() + 5, threading.Event(), waits)  # type: ignore[arg-type]
    assert sock.sent == 1 and writable == []
    assert (waits.eagain, waits.enobufs, waits.slept) == (1, 0, 0.0)


def test_an_eagain_right_after_pollout_backs_off(writable: list[float]) -> None:
    sock, waits = Refusing(errno.EAGAIN, errno.EAGAIN, errno.EAGAIN), SendWaits()
    send_retry(sock, b"x", ("10.0.0.1", 1), time.monotonic() + 5, threading.Event(), waits)  # type: ignore[arg-type]
    assert sock.sent == 1
    assert writable == [0.0005, 0.001]  # POLLOUT said writable and the send still found no room
    assert waits.eagain == 3


def test_a_congested_peer_backs_off_and_is_counted(writable: list[float]) -> None:
    sock, waits = Refusing(errno.ENOBUFS, errno.ENOBUFS), SendWaits()
    send_retry(sock, b"x", ("10.0.0.1", 1), time.monotonic() + 5, threading.Event(), waits)  # type: ignore[arg-type]
    assert sock.sent == 1
    assert writable == [0.0005, 0.001]
    assert (waits.eagain, waits.enobufs) == (0, 2) and waits.slept == pytest.approx(0.0015)
