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

import pyrds
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


def test_a_blocking_recv_that_waits_polls_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rx = pyrds.socket("userspace")
    tx = pyrds.socket("userspace")
    try:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        dest = rx.getsockname()
        tx.sendto(b"warm", dest)  # the first message sets up the loop connection
        assert rx.recv(100) == b"warm"
        monkeypatch.setattr(client_socket.select, "poll", _CountingPoll)
        _CountingPoll.calls = 0
        timer = threading.Timer(0.2, lambda: tx.sendto(b"later", dest))
        timer.start()
        try:
            assert rx.recv(100) == b"later"
        finally:
            timer.join()
        # EAGAIN on the data channel, one poll of the data channel and the readiness fd, the read; the
        # tail read is followed by no poll (was: a poll of the readiness fd before waiting, and one of the
        # data channel after the read)
        assert _CountingPoll.calls == 1
    finally:
        rx.close()
        tx.close()


class _CountingSock:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.recvs = 0

    def recv(self, n: int, flags: int = 0) -> bytes:
        self.recvs += 1
        return self._sock.recv(n, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


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
        counted = _CountingSock(r.a)
        r.a = counted  # type: ignore[assignment]
        r.client_drained(False, 1)
        assert not r.readable and counted.recvs == 0
        # a count that does not cover every byte sent: the service reads the fd to make sure
        r.set_readable(True)
        r.client_drained(False, 1)
        assert not r.readable and counted.recvs >= 1
        assert not select.select([counted._sock], [], [], 0.2)[0], "the fd still holds a byte"
    finally:
        r.a = getattr(r.a, "_sock", r.a)
        r.close()


class _CountingData:
    """The client's data channel socket, its reads counted."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.reads = 0

    def recv_into(self, *args: Any) -> int:
        self.reads += 1
        return self._sock.recv_into(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_an_empty_socket_is_known_empty_from_the_page() -> None:
    """A non-blocking recv with nothing queued fails with EAGAIN without reading the data channel: the
    page's counts say every message the queue took was read (the stack counts one before pushing it)."""
    rx = pyrds.socket("userspace")
    tx = pyrds.socket("userspace")
    try:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        dest = rx.getsockname()
        tx.sendto(b"one", dest)
        assert rx.recv(100) == b"one"
        data = _CountingData(rx._data)  # type: ignore[attr-defined]
        rx._data = data  # type: ignore[attr-defined]
        rx.setblocking(False)
        with pytest.raises(BlockingIOError):
            rx.recv(100)
        assert data.reads == 0
        tx.sendto(b"two", dest)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert rx.recv(100) == b"two"
                break
            except BlockingIOError:
                assert time.monotonic() < deadline
                select.select([rx], [], [], 1)
        assert data.reads >= 1
    finally:
        rx.close()
        tx.close()
