"""The report page (rpc.REPORT_PAGE): a client counts its reads from the data channel there instead of
sending a CONSUMED notice for each, and the stack takes the count whenever what it does next depends on the
receive queue. These check that the stack takes it (a delivery, a poll state it sets), that a page written
with nonsense changes nothing but its own socket's view, and that a client still sends a notice while the
shared page asks for one."""

from __future__ import annotations

import ipaddress
import mmap
import os
from collections.abc import Iterator

import pytest

from pyrds.constants import Transport
from pyrds.testing.helpers import wait_for
from pyrds.userspace import rpc
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.service.datachannel import DataChannel
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.resources import RECV_MSG_OVERHEAD
from pyrds.userspace.stack.sockstate import Incoming, SockState
from tests.unit.userspace.fakes import PageSink as Sink
from tests.unit.userspace.test_datachannel import _requests

LOCAL = ipaddress.ip_address("127.0.0.1")
PEER = ipaddress.ip_address("10.9.9.9")


class Ready:
    """A readiness fd that records what the stack makes it show."""

    def __init__(self) -> None:
        self.readable = False
        self.writable = True
        self.unconfirmed = False
        self.drained: list[tuple[bool, int | None]] = []

    def set_readable(self, flag: bool) -> None:
        self.readable = flag

    def delivered(self, client_taken: int | None = None) -> None:
        self.unconfirmed = False

    def set_writable(self, flag: bool) -> None:
        self.writable = flag

    def client_drained(self, readable: bool, client_taken: int | None = None) -> None:
        self.drained.append((readable, client_taken))
        self.readable = readable

    def close(self) -> None: ...


@pytest.fixture
def receiver() -> Iterator[tuple[Stack, SockState, Sink, Ready]]:
    stack = Stack()
    rs = stack.open()
    stack.bind(rs, LOCAL, 0, 0)
    rs.transport = Transport.TCP
    sink, ready = Sink(), Ready()
    rs.push, rs.readiness = sink, ready
    yield stack, rs, sink, ready


def _deliver(stack: Stack, rs: SockState, payload: bytes = b"x" * 100) -> None:
    stack.deliver(Incoming(PEER, LOCAL, 4000, rs.bound_port, payload))


def test_a_delivery_takes_the_reads_on_the_page_first(receiver: tuple[Stack, SockState, Sink, Ready]) -> None:
    stack, rs, sink, _ready = receiver
    for _ in range(3):
        _deliver(stack, rs)
    assert rs.pushed == 3 and rs.rcv_charge == 3 * (100 + RECV_MSG_OVERHEAD)
    sink.read = 3  # the client read all three; no notice
    _deliver(stack, rs)
    assert len(rs.recv_queue) == 1 and rs.pushed == 1
    assert rs.rcv_charge == 100 + RECV_MSG_OVERHEAD
    assert stack.counters["recv_delivered"] == 3


def test_a_new_reason_to_be_readable_takes_the_page_first(
    receiver: tuple[Stack, SockState, Sink, Ready],
) -> None:
    """The fd shows readable since the push; the client read the message and emptied the fd (counted on its
    page only). A new reason to be readable (here an RDMA notification) must make the fd readable again, not
    find it "already" readable: the stack takes the page first, and the fd is told the client emptied it."""
    stack, rs, sink, ready = receiver
    _deliver(stack, rs)
    assert ready.readable
    sink.read, sink.taken = 1, 1
    rs.update_readiness()  # nothing new: the page can wait
    assert ready.drained == [] and rs.recv_queue
    rs.rdma_notify.append((1, 0))
    rs.update_readiness()
    assert ready.drained == [(True, 1)] and ready.readable
    assert not rs.recv_queue


@pytest.mark.parametrize("read", [-1, 5, 1 << 63, (1 << 64) - 1])
def test_a_page_written_with_nonsense_is_ignored(
    receiver: tuple[Stack, SockState, Sink, Ready], read: int
) -> None:
    """More reads than were pushed, or a count going back: nothing is taken (only this socket's queue stays
    full), and the stack goes on delivering."""
    stack, rs, sink, _ready = receiver
    _deliver(stack, rs)
    sink.read = read
    _deliver(stack, rs)
    assert rs.pushed == 2 and len(rs.recv_queue) == 2
    sink.read = 2  # the truth, later
    _deliver(stack, rs)
    assert rs.pushed == 1 and len(rs.recv_queue) == 1


def test_the_report_page_can_be_written_but_not_resized_by_the_client() -> None:
    channel = DataChannel()
    try:
        _data_fd, _page_fd, report_fd = channel.client_fds()
        with pytest.raises(PermissionError):
            os.ftruncate(report_fd, 0)
        view = mmap.mmap(report_fd, rpc.REPORT_PAGE, mmap.MAP_SHARED)
        rpc.REPORT_COUNTS.pack_into(view, rpc.REPORT_READ_AT, 7, 9)
        assert channel.reported() == (7, 9)
        view.close()
    finally:
        channel.close()


def test_a_full_channel_asks_for_notices_until_half_of_it_was_read() -> None:
    channel = DataChannel()
    try:
        assert channel.page is not None
        pushed = 0
        while channel.push(b"\0" * 16, 4000, 0, bytes(1024), False):
            pushed += 1
        assert channel.page[rpc.PAGE_NOTIFY_AT] == 1
        channel.unblock(pushed - pushed // 2, pushed // 2)
        assert channel.page[rpc.PAGE_NOTIFY_AT] == 0
    finally:
        channel.close()


def test_the_client_sends_a_notice_while_the_page_asks_for_one() -> None:
    a, b = RDSSocket(), RDSSocket()
    try:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        a.sendto(b"hello", b.getsockname())
        a.sendto(b"again", b.getsockname())
        assert wait_for(lambda: rpc.PAGE_COUNT.unpack_from(b._page, rpc.PAGE_QUEUED_AT)[0] >= 2, 5.0)
        # the service's page as it is now, with byte 1 set: as if the channel had been found full
        page = bytearray(b._page[: rpc.SHARED_PAGE])
        page[rpc.PAGE_NOTIFY_AT] = 1
        real, b._page = b._page, page  # type: ignore[assignment]
        ctl = b._ctl
        sent = _requests(b)
        try:
            assert b.recv(100) == b"hello"
        finally:
            b._ctl, b._page = ctl, real
        assert len(sent) == 1 and sent[0][1] == rpc.TAG_CONSUMED, sent
        _tag, count, _drained, reply, _taken = rpc.CONSUMED.unpack(sent[0][1:])
        assert count == 0 and not reply  # the count is on the report page; no answer awaited
        assert b.recv(100) == b"again"
    finally:
        a.close()
        b.close()
