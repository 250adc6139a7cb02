"""Exactly-once, in-order delivery across reconnects: PathEngines back to back over a model of TCP, with a
fake clock and hypothesis choosing when bytes move, when acks arrive and when the connection is reset.

TCP model per direction and connection: bytes the sender wrote are ``inflight`` until the peer's TCP receives
them (they are then in its receive buffer AND acked as far as TCP is concerned: the sender learns it when an
ack step runs); the receiving engine reads the buffer in arbitrary chunks. A reset loses what is in flight and
whatever partial message the receiver's framer holds; the receiver first reads what its TCP already acked (the
driver's graceful close: FIN, read until the peer's FIN), since the sender will never resend it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrds.userspace.proto import MessageReceived, PathEngine


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def tick(self) -> float:
        self.t += 0.001
        return self.t


@dataclass
class Direction:
    src: PathEngine
    dst: PathEngine
    inflight: bytearray = field(default_factory=bytearray)
    rcvbuf: bytearray = field(default_factory=bytearray)
    received: int = 0  # bytes of this connection the receiver's TCP got (= acked)
    got: list[bytes] = field(default_factory=list)

    def write(self) -> None:
        self.inflight += self.src.bytes_to_send()

    def transmit(self, n: int) -> None:
        n = min(n, len(self.inflight))
        self.rcvbuf += self.inflight[:n]
        del self.inflight[:n]
        self.received += n

    def ack(self) -> None:
        self.src.acked_through(self.received)

    def read(self, n: int, clock: Clock) -> None:
        n = min(n, len(self.rcvbuf))
        chunk = bytes(self.rcvbuf[:n])
        del self.rcvbuf[:n]
        for ev in self.dst.feed(chunk, clock.tick()):
            if isinstance(ev, MessageReceived):
                self.got.append(ev.payload)

    def new_connection(self) -> None:
        self.inflight.clear()
        self.rcvbuf.clear()
        self.received = 0


def make_link(index: int, clock: Clock) -> tuple[Direction, Direction]:
    a = PathEngine("10.0.0.1", "10.0.0.2", index)
    b = PathEngine("10.0.0.2", "10.0.0.1", index)
    a.connection_made(clock.t)
    b.connection_made(clock.t)
    return Direction(a, b), Direction(b, a)


def reset(dirs: tuple[Direction, Direction], clock: Clock) -> None:
    for d in dirs:
        d.read(len(d.rcvbuf), clock)  # graceful close: read what TCP acked
    for d in dirs:
        d.src.connection_lost(clock.tick())
        d.new_connection()
    for d in dirs:
        d.src.connection_made(clock.tick())


def settle(dirs: tuple[Direction, Direction], clock: Clock) -> None:
    for _ in range(4):
        for d in dirs:
            d.write()
            d.transmit(len(d.inflight))
            d.read(len(d.rcvbuf), clock)
            d.ack()


step = st.tuples(st.sampled_from(["send", "write", "transmit", "ack", "read", "reset"]), st.integers(0, 400))


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=80), sizes=st.lists(st.integers(0, 300), min_size=1, max_size=8))
def test_exactly_once_in_order_with_random_reconnects(steps: list[tuple[str, int]], sizes: list[int]) -> None:
    clock = Clock()
    dirs = make_link(1, clock)
    sent: list[list[bytes]] = [[], []]
    for i, (op, arg) in enumerate(steps):
        d = dirs[arg % 2]
        if op == "send":
            payload = i.to_bytes(4, "big") + bytes([i % 251]) * sizes[i % len(sizes)]
            d.src.queue(4000 + arg % 2, 5000, payload)
            sent[arg % 2].append(payload)
        elif op == "write":
            d.write()
        elif op == "transmit":
            d.transmit(arg * 7)
        elif op == "ack":
            d.ack()
        elif op == "read":
            d.read(arg * 5, clock)
        else:
            reset(dirs, clock)
    settle(dirs, clock)
    for k in (0, 1):
        assert dirs[k].got == sent[k]
        assert dirs[k].src.queued_msgs == 0


@settings(max_examples=100, deadline=None)
@given(
    plan=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30), st.booleans()), min_size=1, max_size=12)
)
def test_multipath_each_path_keeps_its_sequence_space(plan: list[tuple[int, int, bool]]) -> None:
    """Four paths; sockets hash to a path; every reconnect resets all paths (the driver's policy). Each path's
    stream is delivered exactly once and in order, and stays on its path."""
    clock = Clock()
    links = [make_link(i, clock) for i in range(4)]
    sent: dict[int, list[bytes]] = {i: [] for i in range(4)}
    n = 0
    for path, count, do_reset in plan:
        for _ in range(count):
            payload = f"{path}:{n}".encode()
            n += 1
            links[path][0].src.queue(4000 + path, 5000, payload)
            sent[path].append(payload)
        for d, _back in links:
            d.write()
            d.transmit(len(d.inflight) // 2)  # half reaches the peer; acks not yet seen by the sender
        if do_reset:
            for link in links:
                reset(link, clock)
    for link in links:
        settle(link, clock)
    for i, (d, _back) in enumerate(links):
        assert d.got == sent[i]
        assert all(p.startswith(f"{i}:".encode()) for p in d.got)
