"""The data channel (service/datachannel.py): received messages pushed to the client, read with no request."""

from __future__ import annotations

import errno
import mmap
import os
import select
import signal
import socket
from collections.abc import Iterator

import pytest

from pyrds.testing.helpers import drain_nonblocking
from pyrds.userspace import rpc
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.control import stack_counters
from pyrds.userspace.service.datachannel import DataChannel

Pair = tuple[RDSSocket, RDSSocket]


@pytest.fixture
def pair() -> Iterator[Pair]:
    a, b = RDSSocket(), RDSSocket()
    try:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        yield a, b
    finally:
        a.close()
        b.close()


def _readable(fd: int, timeout_ms: int = 0) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(timeout_ms))


def _requests(sock: RDSSocket) -> list[bytes]:
    """Record what the client sends on its control connection from now on."""
    sent: list[bytes] = []
    ctl = sock._ctl
    assert ctl is not None

    class Spy:
        def __getattr__(self, name: str) -> object:
            return getattr(ctl, name)

        def send(self, data: bytes, *args: int) -> int:
            sent.append(bytes(data))
            return ctl.send(data, *args)

        def sendmsg(self, parts: list[bytes], *args: object) -> int:
            sent.append(b"".join(bytes(p) for p in parts))
            return ctl.sendmsg(parts, *args)  # type: ignore[arg-type]

    sock._ctl = Spy()  # type: ignore[assignment]
    return sent


def test_a_local_message_is_in_the_receivers_data_channel_and_recv_asks_nothing(pair: Pair) -> None:
    a, b = pair
    a.sendto(b"hello", b.getsockname())
    assert _readable(b._data.fileno(), 2000), "the message was not pushed"
    sent = _requests(b)
    assert b.recvfrom(100) == (b"hello", a.getsockname())
    # nothing at all: no RECV request, and the read is counted on the report page, not sent as a notice
    assert sent == []
    assert rpc.REPORT_COUNTS.unpack_from(b._report, rpc.REPORT_READ_AT)[0] == 1
    # the readiness fd follows the queue at once: nothing left to read
    assert not _readable(b.fileno())


def test_peek_truncation_and_order_from_the_channel(pair: Pair) -> None:
    a, b = pair
    for payload in (b"first-message", b"second"):
        a.sendto(payload, b.getsockname())
    assert b.recv(100, socket.MSG_PEEK) == b"first-message"
    data, _anc, flags, addr = b.recvmsg(5)
    assert (data, flags & socket.MSG_TRUNC, addr) == (b"first", socket.MSG_TRUNC, a.getsockname())
    assert _readable(b.fileno())  # the second is still queued
    assert b.recv(100, socket.MSG_DONTWAIT) == b"second"
    assert not _readable(b.fileno())
    with pytest.raises(BlockingIOError):
        b.recv(100, socket.MSG_DONTWAIT)


def test_reads_from_the_channel_show_in_another_sockets_counters_and_info(pair: Pair) -> None:
    a, b = pair
    before = stack_counters(a)["recv_delivered"]
    for _ in range(3):
        a.sendto(b"x", b.getsockname())
    for _ in range(3):
        assert b.recv(10) == b"x"
    # asked through a's connection, right after b's recv returned: b's notices are taken first
    assert stack_counters(a)["recv_delivered"] - before == 3


def test_a_notice_claiming_unpushed_reads_drops_only_that_client(pair: Pair) -> None:
    a, b = pair
    a.sendto(b"one", b.getsockname())
    assert _readable(b._data.fileno(), 2000)
    ctl = b._ctl
    assert ctl is not None
    ctl.send(b"\0" + rpc.CONSUMED_V1.pack(rpc.TAG_CONSUMED, 5, 0, 1))  # 5 read, 1 was pushed
    with pytest.raises(OSError) as exc:
        b.getsockname()
    assert exc.value.errno == errno.EPIPE
    # the stack and its other sockets are unharmed
    c = RDSSocket()
    c.bind(("127.0.0.1", 0))
    a.sendto(b"two", c.getsockname())
    assert c.recv(10) == b"two"
    c.close()


def test_the_shared_page_cannot_be_written_or_resized_by_the_client() -> None:
    """What the client gets of the page (its memfd) can neither be mapped writable nor shrunk under the
    service (whose writes would then fault), while the service's own mapping writes."""
    channel = DataChannel()
    try:
        _data_fd, page_fd, _report_fd = channel.client_fds()
        with pytest.raises(PermissionError):
            mmap.mmap(page_fd, rpc.SHARED_PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(PermissionError):
            os.ftruncate(page_fd, 0)
        with pytest.raises(PermissionError):
            os.pwrite(page_fd, b"\1", 0)
        view = mmap.mmap(page_fd, rpc.SHARED_PAGE, mmap.MAP_SHARED, mmap.PROT_READ)
        channel.set_sync(True)
        assert view[0] == 1
        channel.set_sync(False)
        assert view[0] == 0
        view.close()
    finally:
        channel.close()


def test_writes_into_the_channel_are_refused() -> None:
    s = RDSSocket()
    try:
        with pytest.raises(OSError) as exc:
            s._data.send(b"forged", socket.MSG_DONTWAIT)
        assert exc.value.errno == errno.EPIPE
    finally:
        s.close()


def _service_pid(sock: RDSSocket) -> int:
    ctl = sock._ctl
    assert ctl is not None
    creds = ctl.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[:4], "little")


def test_the_tail_of_the_channel_leaves_the_socket_readable_while_the_stack_holds_more(pair: Pair) -> None:
    """The tail flag is set when a message is pushed; a message queued after it but not pushed yet (the
    channel was full; or a local send whose push waits for the sender's reply) must keep the socket readable
    when the client reads that tail, before the stack has taken its notice. CI 2026-11-26 (stop 21): a
    non-blocking drain after 50 sends got 49 and EAGAIN (test_loop_bound_receiver_never_congests)."""
    a, b = pair
    sent = 0
    while stack_counters(a)["recv_pushed"] == sent:  # until the channel (a few MiB) stops taking them
        a.sendto(b"m" * 60000, b.getsockname())
        sent += 1
        assert sent < 1000, "the channel never filled"
    pid = _service_pid(b)
    got = 0
    os.kill(pid, signal.SIGSTOP)  # the stack takes no notice (and pushes nothing) until SIGCONT
    try:
        while _readable(b._data.fileno()):
            assert b._pushed(60000, 0) is not None
            got += 1
        assert 0 < got < sent
        readable = _readable(b.fileno())
    finally:
        os.kill(pid, signal.SIGCONT)
    assert readable, "the readiness fd was emptied while the stack held unread messages"
    got += len(drain_nonblocking(b))
    assert got == sent
