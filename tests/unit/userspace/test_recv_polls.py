"""What a userspace recv costs in system calls besides the read (issue 10: under TCG every call counts): a
blocking recv that has to wait polls once, for both of its fds, and a read of the tail of the queue needs no
poll of the data channel (the shared page's counts say it is empty). The service learns that the client
emptied the readiness fd from the count of bytes it took, and reads the fd only when that count does not
cover every byte sent."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any

import pytest

from pyrds.userspace.client import socket as client_socket
from pyrds.userspace.service.readiness import Readiness

_REAL_POLL = select.poll


class _CountingPoll:
    """select.poll() whose poll calls are counted."""

    calls = 0

    def __init__(self) -> None:
        self._p = _REAL_POLL()

    def register(self, fd: int, events: int) -> None:
        self._p.register(fd, events)

    def poll(self, timeout: Any = None) -> list[tuple[int, int]]:
        type(self).calls += 1
        return self._p.poll(timeout)


def test_a_blocking_recv_that_waits_polls_once(
    loop_pair: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rx, tx, dest = loop_pair
    monkeypatch.setattr(client_socket.select, "poll", _CountingPoll)
    _CountingPoll.calls = 0
    timer = threading.Timer(0.2, lambda: tx.sendto(b"later", dest))
    timer.start()
    try:
        assert rx.recv(100) == b"later"
    finally:
        timer.join()
    # one poll of the data channel and the readiness fd, then the read; no read of the empty channel before
    # it, no poll after the tail read (was: a read that failed with EAGAIN, a poll of the readiness fd
    # before waiting, and one of the data channel after the read)
    assert _CountingPoll.calls == 1


class _Counting:
    """A socket whose calls of one method are counted (everything else passes through)."""

    def __init__(self, sock: socket.socket, method: str) -> None:
        self._sock = sock
        self._method = method
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sock, name)
        if name != self._method:
            return attr

        def counted(*args: Any) -> Any:
            self.calls += 1
            return attr(*args)

        return counted


def test_service_trusts_a_drain_count_that_covers_every_byte() -> None:
    r = Readiness()
    try:
        r.set_readable(True)
        assert r.sent == 1
        deadline = time.monotonic() + 5
        got = b""
        while not got and time.monotonic() < deadline:
            try:
                got = r.a.recv(16, socket.MSG_DONTWAIT)  # the client empties the fd
            except BlockingIOError:
                time.sleep(0.01)
        assert got == b"r"
        counted = _Counting(r.a, "recv")
        r.a = counted  # type: ignore[assignment]
        r.client_drained(False, 1)
        assert not r.readable and counted.calls == 0
        # a count that does not cover every byte sent: the service reads the fd to make sure
        r.set_readable(True)
        r.client_drained(False, 1)
        assert not r.readable and counted.calls >= 1
        assert not select.select([counted._sock], [], [], 0.2)[0], "the fd still holds a byte"
    finally:
        r.a = getattr(r.a, "_sock", r.a)
        r.close()


def test_an_empty_socket_is_known_empty_from_the_page(loop_pair: tuple[Any, Any, Any]) -> None:
    """A non-blocking recv with nothing queued fails with EAGAIN without reading the data channel: the
    page's counts say every message the queue took was read (the stack counts one before pushing it)."""
    rx, tx, dest = loop_pair
    data = _Counting(rx._data, "recv_into")
    rx._data = data
    rx.setblocking(False)
    with pytest.raises(BlockingIOError):
        rx.recv(100)
    assert data.calls == 0
    tx.sendto(b"two", dest)
    deadline = time.monotonic() + 10
    while True:
        try:
            assert rx.recv(100) == b"two"
            break
        except BlockingIOError:
            assert time.monotonic() < deadline
            select.select([rx], [], [], 1)
    assert data.calls >= 1
