"""The receive-queue cap of the stack core (stack/resources.py; docs/userspace.md, "Bounded resources"),
without a service: a local sender is refused with ENOBUFS once the destination queue is over its cap, a
transport holding a connection is resumed when the queue drains to half the cap or the socket closes."""

from __future__ import annotations

import errno
import ipaddress

import pytest

from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.errors import MustWait, StackError
from pyrds.userspace.stack.resources import RECV_MSG_OVERHEAD, recv_cap
from pyrds.userspace.stack.sockstate import Incoming
from pyrds.userspace.transports import loop_transport

LO = ipaddress.ip_address("127.0.0.1")
PAYLOAD = b"x" * 4096


def _stack() -> Stack:
    stack = Stack()
    stack.attach(loop_transport(stack))
    return stack


def test_local_sender_refused_over_the_cap_and_served_after_drain() -> None:
    stack = _stack()
    rx, tx = stack.open(), stack.open()
    stack.bind(rx, LO, 4000, 0)
    stack.bind(tx, LO, 0, 0)
    cap = recv_cap(rx.rcvbuf)
    sent = 0
    with pytest.raises(StackError) as err:
        while True:
            stack.sendmsg(tx, PAYLOAD, [], 0, (LO, 4000), nonblock=True)
            sent += 1
            assert sent < 10 * cap // len(PAYLOAD), "never refused"
    assert err.value.code == errno.ENOBUFS
    assert rx.rcv_charge >= cap
    assert rx.rcv_charge < cap + len(PAYLOAD) + RECV_MSG_OVERHEAD
    with pytest.raises(MustWait):  # a blocking sender waits, as for a congested port
        stack.sendmsg(tx, PAYLOAD, [], 0, (LO, 4000), nonblock=False)
    assert stack.counters["send_cap_refused"] == 2
    stack.recvmsg(rx, 1 << 20, 0, 0, True)
    assert stack.sendmsg(tx, PAYLOAD, [], 0, (LO, 4000), nonblock=True) == len(PAYLOAD)
    stack.close(rx)
    assert rx.rcv_charge == 0 and not rx.recv_queue


def _fill(stack: Stack, port: int) -> int:
    """Deliver messages to (LO, port) as a transport does until deliver() says the queue is over its cap."""
    n = 0
    while stack.deliver(Incoming(ipaddress.ip_address("10.0.0.1"), LO, 4000, port, PAYLOAD, n + 1, 0)):
        n += 1
    return n + 1


def test_held_reader_resumed_at_half_the_cap() -> None:
    stack = _stack()
    rx = stack.open()
    stack.bind(rx, LO, 4001, 0)
    n = _fill(stack, 4001)
    resumed: list[int] = []
    assert stack.hold_reader(LO, 4001, 1, lambda: resumed.append(1))
    assert not stack.hold_reader(LO, 4002, 2, lambda: resumed.append(2))  # no such socket: keep reading
    cap = recv_cap(rx.rcvbuf)
    got = 0
    while rx.rcv_charge > cap // 2:
        assert not resumed
        stack.recvmsg(rx, 1 << 20, 0, 0, True)
        got += 1
    assert resumed == [1] and got < n
    assert stack.counters["recv_cap_hold"] == 1


def test_held_reader_resumed_when_the_socket_closes() -> None:
    stack = _stack()
    rx = stack.open()
    stack.bind(rx, LO, 4003, 0)
    _fill(stack, 4003)
    resumed: list[int] = []
    assert stack.hold_reader(LO, 4003, 7, lambda: resumed.append(7))
    stack.close(rx)
    assert resumed == [7]
    assert rx.rcv_charge == 0 and not rx.recv_queue and not rx.rcv_waiters
