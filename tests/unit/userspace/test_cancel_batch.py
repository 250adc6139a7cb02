"""``rds_send_drop_to`` in bulk: closing a socket (``rds_release``) or RDS_CANCEL_SENT_TO hands all of its
messages to each transport in one :meth:`Transport.cancel` call, and RDS/TCP takes them off its queues in a
number of steps linear in the messages and the queues, not in their product (a socket holds ~100k one-byte
messages at the default send buffer; a quadratic cancel stalled the shared service for every user)."""

from __future__ import annotations

import ipaddress
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from pyrds.addr import IPAddress
from pyrds.constants import Transport as TransportType
from pyrds.userspace.proto.path import PathEngine
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.ports import normalize
from pyrds.userspace.stack.sockstate import Outgoing, SockState
from pyrds.userspace.transports import loop_transport
from pyrds.userspace.transports.tcp.transport import TcpTransport
from tests.unit.userspace.fakes import FakeSvc, NullTransport

SRC = ipaddress.ip_address("198.51.100.1")  # documentation addresses: not on this host, nobody answers
DESTS = tuple(ipaddress.ip_address(f"198.51.100.{i}") for i in (2, 3, 4))
DPORT = 4000


class RecordingTransport(NullTransport):
    """A transport that keeps what it is given and records every cancel call."""

    def __init__(self, kind: TransportType) -> None:
        self.kind = kind
        self.cancels: list[list[Outgoing]] = []

    def laddr_check(self, ip: IPAddress) -> bool:
        return True

    def cancel(self, msgs: Sequence[Outgoing]) -> None:
        self.cancels.append(list(msgs))


def stack_from_src() -> Stack:
    """A stack for which :data:`SRC` is the one local address (nothing else is attached)."""
    stack = Stack()

    def is_local(ip: IPAddress, scope_id: int = 0) -> bool:
        return normalize(ip) == SRC

    stack.is_local = is_local  # type: ignore[method-assign]
    return stack


def socket_with_sends(
    stack: Stack, count: int, dests: Sequence[IPAddress]
) -> tuple[SockState, list[Outgoing]]:
    """A socket bound to SRC that sent ``count`` one-byte messages, to ``dests`` in turn (all unacked)."""
    rs = stack.open()
    rs.sndbuf = max(rs.sndbuf, 8 * count)  # room for twice as many (rds_sndbuf is half of it)
    stack.bind(rs, SRC, 0, 0)
    return rs, send_more(stack, rs, count, dests)


def send_more(stack: Stack, rs: SockState, count: int, dests: Sequence[IPAddress]) -> list[Outgoing]:
    """``count`` more one-byte messages from ``rs``, to ``dests`` in turn."""
    before = set(rs.sent)
    for i in range(count):
        stack.sendmsg(rs, bytes([i % 256]), [], 0, (dests[i % len(dests)], DPORT), True)
    msgs = [m for key, m in rs.sent.items() if key not in before]
    assert len(msgs) == count
    return msgs


def recording_stack() -> tuple[Stack, RecordingTransport, RecordingTransport]:
    stack = stack_from_src()
    loop, net = RecordingTransport(TransportType.LOOP), RecordingTransport(TransportType.TCP)
    stack.attach(loop)
    stack.attach(net)
    return stack, loop, net


def test_close_cancels_every_message_in_one_call_per_transport() -> None:
    """``rds_release`` -> ``rds_send_drop_to(rs, NULL)``: all of the socket's messages, to every
    destination, go to each transport in one call (in the order they were sent)."""
    stack, loop, net = recording_stack()
    rs, msgs = socket_with_sends(stack, 30, DESTS)
    stack.close(rs)
    assert loop.cancels == [msgs] and net.cancels == [msgs]
    assert rs.sent == {}


def test_cancel_sent_to_cancels_that_destination_in_one_call_per_transport() -> None:
    stack, loop, net = recording_stack()
    rs, msgs = socket_with_sends(stack, 30, DESTS)
    stack.cancel_sent_to(rs, DESTS[1], DPORT)
    to_dest = [m for m in msgs if m.daddr == DESTS[1]]
    assert len(to_dest) == 10 and loop.cancels == [to_dest] and net.cancels == [to_dest]
    assert list(rs.sent.values()) == [m for m in msgs if m.daddr != DESTS[1]]
    assert rs.snd_bytes == 20 and stack.counters["send_canceled"] == 10
    stack.cancel_sent_to(rs, DESTS[1], DPORT)  # nothing left to that destination: no transport call
    stack.close(rs)
    assert net.cancels[1:] == [[m for m in msgs if m.daddr != DESTS[1]]]


class Examined:
    """Counts the entries read out of the queues it wraps (:meth:`wrap`): the work a cancel does."""

    def __init__(self) -> None:
        self.count = 0

    def wrap(self, queue: deque[Any]) -> deque[Any]:
        examined = self

        class Counting(deque[Any]):
            def __iter__(self) -> Iterator[Any]:
                for item in super().__iter__():
                    examined.count += 1
                    yield item

        return Counting(queue)


def tcp_stack_with_one_path_up() -> tuple[Stack, TcpTransport]:
    """A stack with the loop and RDS/TCP transports; the connection to ``DESTS[0]`` has its path 0 up
    without a socket (messages go into its engine and stay there), every other destination never connects
    (the dial cannot bind :data:`SRC`: the messages stay staged)."""
    stack = stack_from_src()
    stack.attach(loop_transport(stack))
    tcp = TcpTransport(stack, FakeSvc())
    stack.attach(tcp)
    tcp.conn(SRC, DESTS[0]).paths[0].engine.connection_made(time.monotonic())
    return stack, tcp


def held(engine: PathEngine) -> list[int]:
    """The sequence numbers of the sockets' messages ``engine`` holds (not the probe ping path 0 sends
    when the first message hashes to a path > 0)."""
    return sorted(r.seq for r in [*engine.unacked, *engine.unsent] if r.dport == DPORT)


def count_queue_reads(tcp: TcpTransport) -> Examined:
    examined = Examined()
    for c in tcp.conns.values():
        for p in c.paths:
            p.staged = examined.wrap(p.staged)
            p.engine._send_queue = examined.wrap(p.engine._send_queue)
            p.engine._written = examined.wrap(p.engine._written)
    return examined


def test_tcp_close_reads_each_queue_entry_a_bounded_number_of_times() -> None:
    """Closing a socket with ``n`` messages staged on one connection and in the engine (written and not) of
    another reads about ``n`` queue entries: a cancel per message read the other connection's staging queue
    and the engine's retransmit queue again for every message (46050 entries here)."""
    stack, tcp = tcp_stack_with_one_path_up()
    n = 600
    rs, msgs = socket_with_sends(stack, n // 2, DESTS[:2])
    engine = tcp.conn(SRC, DESTS[0]).paths[0].engine
    engine.buffers_to_send()  # the first messages to DESTS[0] are written, not acked
    more = send_more(stack, rs, n // 2, DESTS[:2])
    examined = count_queue_reads(tcp)
    staged = tcp.conn(SRC, DESTS[1]).paths[0].staged
    assert len(staged) == n // 2 and len(held(engine)) == n // 2 and engine.unacked and engine.unsent
    examined.count = 0
    stack.close(rs)
    assert examined.count <= 2 * n
    assert not staged and held(engine) == [] and engine.queued_bytes == 0
    assert all(not p.pending for c in tcp.conns.values() for p in c.paths)
    assert len(msgs) + len(more) == n


def test_tcp_cancel_sent_to_reads_each_queue_entry_a_bounded_number_of_times() -> None:
    """RDS_CANCEL_SENT_TO for one of two destinations: the messages to it leave, in a number of reads
    linear in the queues (a cancel per message read 90600 here); the other destination's messages stay, in
    order."""
    stack, tcp = tcp_stack_with_one_path_up()
    n = 600
    rs, msgs = socket_with_sends(stack, n, DESTS[:2])
    engine = tcp.conn(SRC, DESTS[0]).paths[0].engine
    examined = count_queue_reads(tcp)
    staged = tcp.conn(SRC, DESTS[1]).paths[0].staged
    stack.cancel_sent_to(rs, DESTS[0], DPORT)
    assert examined.count <= 2 * n
    assert held(engine) == [] and engine.queued_bytes == 0
    assert list(staged) == [m for m in msgs if m.daddr == DESTS[1]]
    examined.count = 0
    stack.cancel_sent_to(rs, DESTS[1], DPORT)
    assert examined.count <= 2 * n and not staged
    assert rs.sent == {} and rs.snd_bytes == 0


def test_tcp_cancel_takes_only_the_given_messages_off_every_path() -> None:
    """The batch may hold messages staged, in the engine and of other connections; each leaves the path it
    is on, the others stay, in order. A message the path does not hold is ignored, even with the sequence
    number of one it holds."""
    stack, tcp = tcp_stack_with_one_path_up()
    _rs, msgs = socket_with_sends(stack, 12, DESTS)
    up = tcp.conn(SRC, DESTS[0]).paths[0]
    up.engine.buffers_to_send()
    cancelled = msgs[::3][:3] + msgs[1::3][:2]  # three of the four to DESTS[0], two of DESTS[1]'s four
    foreign = Outgoing(9, SRC, DESTS[0], 1, 2, b"never sent", seq=msgs[9].seq)
    tcp.cancel([*cancelled, foreign])
    assert held(up.engine) == [msgs[9].seq] and list(up.pending.values()) == [msgs[9]]
    assert up.engine.queued_bytes == 1
    assert list(tcp.conn(SRC, DESTS[1]).paths[0].staged) == msgs[1::3][2:]
    assert list(tcp.conn(SRC, DESTS[2]).paths[0].staged) == msgs[2::3]
