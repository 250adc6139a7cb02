"""``pyrds stress`` waits for readiness with one poll(2) per wait, never a selector made per message."""

from __future__ import annotations

import selectors
import socket
import time

import pytest

from pyrds.cli import stress_proto
from pyrds.cli.stress_proto import wait_fd


@pytest.fixture
def no_selectors(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("a selector was made for one wait (epoll_create1/ctl/wait/close per message)")

    monkeypatch.setattr(selectors, "DefaultSelector", refuse)
    monkeypatch.setattr(stress_proto.selectors, "DefaultSelector", refuse)


def test_readable_and_writable_are_reported(no_selectors: None) -> None:
    a, b = socket.socketpair()
    with a, b:
        assert wait_fd(a, selectors.EVENT_WRITE, 1.0)
        t0 = time.monotonic()
        assert not wait_fd(a, selectors.EVENT_READ, 0.05)
        assert time.monotonic() - t0 >= 0.04  # it waited the timeout, not less
        b.send(b"x")
        assert wait_fd(a, selectors.EVENT_READ, 1.0)
        t0 = time.monotonic()
        assert wait_fd(a, selectors.EVENT_READ, -1.0)  # a negative timeout polls, never waits for ever
        assert a.recv(1) == b"x"
        assert not wait_fd(a, selectors.EVENT_READ, -1.0)
        assert time.monotonic() - t0 < 0.5


def test_a_closed_fd_number_that_comes_back_is_waited_on_afresh(no_selectors: None) -> None:
    a, b = socket.socketpair()
    fd = a.fileno()
    b.send(b"x")
    assert wait_fd(a, selectors.EVENT_READ, 1.0)
    a.close()
    b.close()
    c, d = socket.socketpair()
    with c, d:
        same = c if c.fileno() == fd else d if d.fileno() == fd else None
        if same is None:
            pytest.skip("the fd number did not come back")  # not expected: the lowest free fd is reused
        assert not wait_fd(same, selectors.EVENT_READ, 0.05)
        (d if same is c else c).send(b"y")
        assert wait_fd(same, selectors.EVENT_READ, 1.0)
