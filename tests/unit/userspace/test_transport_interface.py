"""The stack's side of the transport interface: which transport a destination gets, and the outbox that hands
a sent message to an I/O transport only after the sender was answered."""

from __future__ import annotations

import ipaddress

from pyrds.constants import Transport as TransportType
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.outbox import Outbox
from pyrds.userspace.stack.sockstate import Outgoing
from pyrds.userspace.stack.transport import HashKey, Transport, select_transport
from pyrds.userspace.transports import loop_transport, tcp_transport
from tests.unit.userspace.fakes import FakeSvc

A, B = ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("10.0.0.2")


class Recorder:
    """A network transport that only records what it is given."""

    kind = TransportType.TCP
    immediate = False

    def __init__(self, prefer_loopback: bool = True) -> None:
        self.prefer_loopback = prefer_loopback
        self.sent: list[tuple[Outgoing, HashKey]] = []
        self.calls: list[str] = []

    def transmit(self, msg: Outgoing, hash_key: HashKey) -> None:
        self.sent.append((msg, hash_key))
        self.calls.append(msg.payload.decode())

    def cork(self) -> None:
        self.calls.append("cork")

    def uncork(self) -> None:
        self.calls.append("uncork")


def test_select_transport_follows_prefer_loopback() -> None:
    stack = Stack()
    loop = loop_transport(stack)
    tcp = tcp_transport(stack, FakeSvc())
    assert select_transport([loop, tcp], local_dest=True) is loop
    assert select_transport([loop, tcp], local_dest=False) is tcp
    assert select_transport([loop], local_dest=True) is loop
    assert select_transport([loop], local_dest=False) is None  # no route: the send says EADDRNOTAVAIL
    net: Transport = Recorder(prefer_loopback=False)  # type: ignore[assignment]
    assert select_transport([loop, net], local_dest=True) is net


def test_outbox_hands_messages_over_only_when_flushed_in_order() -> None:
    net = Recorder()
    box = Outbox()
    first = Outgoing(1, A, B, 4000, 5000, b"one")
    second = Outgoing(1, A, B, 4000, 5000, b"two")
    box.put(net, first, (4000, 7))  # type: ignore[arg-type]
    box.put(net, second, (4000, 7))  # type: ignore[arg-type]
    assert net.sent == []
    box.flush()
    assert [m.payload for m, _k in net.sent] == [b"one", b"two"]
    # one batch: written together (TcpTransport queues while corked and kicks each path once)
    assert net.calls == ["cork", "one", "two", "uncork"]
    box.flush()
    assert len(net.sent) == 2
