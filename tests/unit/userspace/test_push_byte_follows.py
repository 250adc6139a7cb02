"""A pushed tail says when its readiness byte is still to come (rpc.PUSH_BYTE_FOLLOWS), and a client that
reads it before the byte is there waits for it.

Before: the service pushed the message, then wrote the readiness byte. A client woken by the push read the
message, emptied the (still empty) readiness fd and returned; the byte arrived after that, so the fd was
readable with nothing behind it, and the next blocking recv found the fd readable, the channel empty, and
asked the service (a control round trip on about one message in five in a request/response loop over
RDS/TCP, measured on the host).
"""

from __future__ import annotations

import ipaddress
import mmap
import socket
import threading
from collections.abc import Iterator

import pytest

from pyrds.constants import Transport
from pyrds.userspace import rpc
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.sockstate import Incoming, SockState
from tests.unit.userspace.fakes import PageSink
from tests.unit.userspace.test_datachannel import _readable

LOCAL = ipaddress.ip_address("127.0.0.1")
PEER = ipaddress.ip_address("10.9.9.9")


class Log(PageSink):
    """A data channel and a readiness fd that record, in one list, what the stack does to them."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, object]] = []
        self.room = 1 << 30
        self.readable = False
        self.writable = True
        self.unconfirmed = False
        self.trace_delivery = False  # delivered() calls in ``events`` too

    def push(
        self, saddr: bytes, sport: int, scope_id: int, payload: bytes, tail: bool, byte_follows: bool = False
    ) -> bool:
        if not self.room:
            return False
        self.room -= 1
        self.events.append(("push", (payload, tail, byte_follows)))
        return True

    # ReadinessSink
    def set_readable(self, flag: bool) -> None:
        if flag != self.readable:
            self.events.append(("readable", flag))
            self.unconfirmed = flag  # as Readiness: a byte went out, its arrival not seen yet
        self.readable = flag

    def delivered(self, client_taken: int | None = None) -> None:
        if self.trace_delivery:
            self.events.append(("delivered", client_taken))
        self.unconfirmed = False

    def set_writable(self, flag: bool) -> None:
        self.writable = flag

    def client_drained(self, readable: bool, client_taken: int | None = None) -> None:
        self.events.append(("readable", readable))
        self.readable = readable


@pytest.fixture
def receiver() -> Iterator[tuple[Stack, SockState, Log]]:
    stack = Stack()
    rs = stack.open()
    stack.bind(rs, LOCAL, 0, 0)
    rs.transport = Transport.TCP
    log = Log()
    rs.push, rs.readiness = log, log
    yield stack, rs, log


def _deliver(stack: Stack, rs: SockState, payload: bytes) -> None:
    stack.deliver(Incoming(PEER, LOCAL, 4000, rs.bound_port, payload))


def test_a_tail_pushed_to_an_empty_fd_says_its_byte_follows(receiver: tuple[Stack, SockState, Log]) -> None:
    stack, rs, log = receiver
    _deliver(stack, rs, b"one")
    assert log.events == [("push", (b"one", True, True)), ("readable", True)]
    log.events.clear()
    _deliver(stack, rs, b"two")  # "one" is unread: the fd is readable already, no byte follows
    assert log.events == [("push", (b"two", True, False))]


def test_after_the_client_emptied_the_fd_its_byte_comes_before_the_push(
    receiver: tuple[Stack, SockState, Log],
) -> None:
    """The client read the pushed tail and emptied the fd (its page says so) while a message the channel had
    no room for was still queued: the fd is made readable again before that message is pushed, so the push
    can say no byte follows and mean it."""
    stack, rs, log = receiver
    log.room = 1
    _deliver(stack, rs, b"one")
    _deliver(stack, rs, b"two")  # no room: stays queued, served later
    assert rs.pushed == 1 and len(rs.recv_queue) == 2
    log.events.clear()
    log.room = 10
    log.read, log.taken = 1, 1  # read "one", emptied the fd
    stack.pull_reads(rs)
    assert log.events == [("readable", True), ("push", (b"two", True, False))]


def test_the_last_byte_is_confirmed_delivered_before_the_next_push(
    receiver: tuple[Stack, SockState, Log],
) -> None:
    """The readiness byte's arrival is checked before the next push (with what the client's report page
    says it took from the fd), not right after the byte was sent."""
    stack, rs, log = receiver
    log.trace_delivery = True
    _deliver(stack, rs, b"one")
    assert log.events == [("push", (b"one", True, True)), ("readable", True)]
    assert log.unconfirmed
    log.events.clear()
    log.read, log.taken = 1, 1  # the client read "one" and took its byte
    _deliver(stack, rs, b"two")
    assert ("delivered", 1) in log.events, log.events
    assert log.events.index(("delivered", 1)) < log.events.index(("push", (b"two", True, True))), log.events


# -- the client's side: a real socket of a live service, its channel and readiness fd replaced by pairs the
# test writes (the page still says what the stack's queue took, as the stack would)


def _page(queued: int) -> mmap.mmap:
    """Stands for the shared page: the stack's queue took ``queued`` messages, none served by request."""
    page = mmap.mmap(-1, rpc.SHARED_PAGE)
    rpc.PAGE_COUNT.pack_into(page, rpc.PAGE_QUEUED_AT, queued)
    return page


def _rigged(sock: RDSSocket) -> tuple[socket.socket, socket.socket]:
    """Give ``sock`` a data channel and a readiness fd whose other ends the test holds."""
    chan_srv, chan_cli = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ready_srv, ready_cli = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sock._data.close()
    sock._ready.close()
    sock._data, sock._ready = chan_cli, ready_cli
    sock._page.close()
    sock._page = _page(sock._pushed_read + 1)
    return chan_srv, ready_srv


def _push(chan: socket.socket, payload: bytes, flags: int) -> None:
    head = rpc.PUSH_HDR.pack(len(payload), 4000, 0, 4, flags, LOCAL.packed)
    chan.send(head + payload)


@pytest.fixture
def rigged() -> Iterator[tuple[RDSSocket, socket.socket, socket.socket]]:
    sock = RDSSocket()
    sock.bind(("127.0.0.1", 0))
    chan, ready = _rigged(sock)
    try:
        yield sock, chan, ready
    finally:
        sock.close()
        chan.close()
        ready.close()


def test_a_read_of_a_tail_whose_byte_follows_waits_for_it_and_takes_it(
    rigged: tuple[RDSSocket, socket.socket, socket.socket],
) -> None:
    sock, chan, ready = rigged
    _push(chan, b"hello", rpc.PUSH_TAIL | rpc.PUSH_BYTE_FOLLOWS)
    later = threading.Timer(0.05, lambda: ready.send(b"r"))  # the service's byte, a little late
    later.start()
    try:
        assert sock.recv(100) == b"hello"
    finally:
        later.join()
    # the byte arrived while recv waited and was taken: nothing readable is left behind the message
    assert not _readable(sock._ready.fileno(), 100)
    assert sock._ready_taken == 1


def test_a_tail_without_a_byte_to_follow_does_not_wait(
    rigged: tuple[RDSSocket, socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, chan, _ready = rigged
    waits: list[int] = []
    monkeypatch.setattr(sock, "_poll", lambda fd, timeout_ms: waits.append(fd) or False)
    _push(chan, b"hello", rpc.PUSH_TAIL)
    assert sock.recv(100) == b"hello"
    assert waits == [] and sock._ready_taken == 0
