"""A data channel found full is not written again until the client reports that it read half of what the
channel held: before, every message delivered to a reader whose channel was full cost a failed sendmsg (a
fan-in backlog in a 7.3 guest: 2.35 push attempts per message), and then every read reported (one message
of room, one push, the channel full again: 1.84 sendmsg per message in a 7.3 guest's fan-in)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from pyrds.constants import Transport
from pyrds.userspace.service.datachannel import DataChannel
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.sockstate import Incoming

SRC = socket.inet_aton("10.0.0.1")


class CountingSock:
    def __init__(self, inner: socket.socket) -> None:
        self.inner = inner
        self.calls = 0

    def sendmsg(self, *a: Any) -> int:
        self.calls += 1
        return self.inner.sendmsg(*a)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_full_channel_is_not_written_until_a_read_is_reported() -> None:
    ch = DataChannel()
    try:
        counting = CountingSock(ch.srv)
        ch.srv = counting  # type: ignore[assignment]
        payload = bytes(1024)
        pushed = 0
        while ch.push(SRC, 4000, 0, payload, False):
            pushed += 1
            assert pushed < 1_000_000
        assert pushed > 0 and ch.blocked
        tried = counting.calls
        for _ in range(100):
            assert not ch.push(SRC, 4000, 0, payload, False)
        assert counting.calls == tried, "a channel known full was written again"
        ch.cli.recv(65536)  # the client reads one
        ch.unblock(1, pushed - 1)  # and says so (CONSUMED)
        assert ch.blocked, "one read made room for one message: not worth a push that fills it again"
        for _ in range(100):
            assert not ch.push(SRC, 4000, 0, payload, False)
        assert counting.calls == tried
        left = pushed - 1
        while left > pushed // 2:
            ch.cli.recv(65536)
            left -= 1
            assert ch.blocked
            ch.unblock(1, left)
        assert not ch.blocked, "half of the channel was read"
        for _ in range(pushed - left):
            assert ch.push(SRC, 4000, 0, payload, False)  # the room the reads made, a push each
        assert counting.calls == tried + pushed - left
    finally:
        ch.srv = counting.inner
        ch.close()


def test_a_read_by_request_from_an_empty_channel_ends_a_block() -> None:
    """Only CONSUMED notices ended a block: a channel found full while empty (no notice can follow) would have
    sent every later message by request. A read served by request finds the channel empty (it is refused
    while pushed messages wait), so the next message is pushed again."""
    local, peer = ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.9.9.9")
    stack = Stack()
    rs = stack.open()
    stack.bind(rs, local, 0, 0)
    rs.transport = Transport.TCP
    ch = DataChannel()
    try:
        rs.push = ch
        ch.blocked = True  # found full with nothing of this socket's in it
        stack.deliver(Incoming(peer, local, 4000, rs.bound_port, b"first"))
        assert rs.pushed == 0, "a blocked channel is not written"
        data, _anc, _flags, _addr = stack.recvmsg(rs, 100, 0, 0, False)
        assert data == b"first" and not ch.blocked
        stack.deliver(Incoming(peer, local, 4000, rs.bound_port, b"second"))
        assert rs.pushed == 1
        assert ch.cli.recv(65536).endswith(b"second")
    finally:
        rs.push = None
        ch.close()
