"""A fake verbs layer for two :class:`IbEngine` objects: one RC queue pair each way, nothing real.

What it models of RC + rdma_cm, and nothing more:
- connect: the active engine's REQ private data reaches the passive engine padded to 56 bytes, the REP's to
  196 bytes (rdma_cm hands over the whole CM area, zero padded);
- receive queue: the buffers each engine asks for (``recv_to_post``), each 48 + 4096 bytes; a SEND consumes
  the oldest one; more bytes than a buffer holds is IB_WC_LOC_LEN_ERR (the test fails: the kernel would drop
  the connection); no buffer posted is an RNR NAK (the SEND waits on the wire and is retried);
- in-order delivery of SENDs, each completing as ``recv_complete(header + fragment)``;
- send completions only for signalled WRs, after the SEND was delivered, in posting order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pyrds.userspace.transports.ib.engine import IbEngine
from pyrds.userspace.transports.ib.events import IbEvent
from pyrds.userspace.transports.ib.frag import SendWR
from pyrds.userspace.transports.ib.wire import CM_PRIVATE_DATA_MAX, RECV_BUF_SIZE

REQ_AREA = 56


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def tick(self, dt: float = 0.001) -> float:
        self.t += dt
        return self.t


@dataclass
class Side:
    engine: IbEngine
    posted: int = 0  # receive buffers posted on this side's QP
    wire_in: deque[SendWR] = field(default_factory=deque)  # SENDs on their way to this side
    events: list[IbEvent] = field(default_factory=list)
    frames: list[SendWR] = field(default_factory=list)  # every SEND this side received, in order
    rnr_waits: int = 0


class FakeLink:
    """Engines ``a`` (active) and ``b`` (passive) joined by a fake RC QP pair."""

    def __init__(self, a: IbEngine, b: IbEngine, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.a = Side(a)
        self.b = Side(b)

    def peer(self, side: Side) -> Side:
        return self.b if side is self.a else self.a

    def connect(self) -> None:
        now = self.clock.tick()
        req = self.a.engine.connect(now)
        answer = self.b.engine.on_request(req.ljust(REQ_AREA, b"\0"), now)
        assert answer.accept, answer.reason
        for side in (self.a, self.b):
            side.posted = 0
            side.wire_in.clear()
        self.b.events += self.b.engine.established(now)
        self.a.events += self.a.engine.on_reply(answer.private_data.ljust(CM_PRIVATE_DATA_MAX, b"\0"), now)
        self.refill()

    def disconnect(self) -> None:
        now = self.clock.tick()
        for side in (self.a, self.b):
            side.engine.connection_lost(now)
            side.posted = 0
            side.wire_in.clear()

    def refill(self) -> None:
        for side in (self.a, self.b):
            side.posted += side.engine.recv_to_post()
            assert side.posted == side.engine.recv_posted

    def post(self, side: Side) -> int:
        """Post what ``side`` has to send (onto the wire towards its peer)."""
        wrs = side.engine.poll_send()
        self.peer(side).wire_in.extend(wrs)
        return len(wrs)

    def deliver_one(self, side: Side) -> SendWR | None:
        """Deliver the next SEND waiting for ``side`` (None if none, or no receive buffer: RNR)."""
        if not side.wire_in:
            return None
        if side.posted == 0:
            side.rnr_waits += 1
            return None
        wr = side.wire_in.popleft()
        data = wr.data
        assert len(data) <= RECV_BUF_SIZE, f"IB_WC_LOC_LEN_ERR: SEND of {len(data)} bytes"
        side.posted -= 1
        side.frames.append(wr)
        side.events += side.engine.recv_complete(data, self.clock.tick())
        sender = self.peer(side).engine
        if wr.signaled:
            sender.send_complete(wr.wr_id)
        self.refill()
        return wr

    def pump(self, limit: int = 1_000_000) -> None:
        """Post and deliver until both directions are quiet."""
        for _ in range(limit):
            moved = self.post(self.a) + self.post(self.b)
            moved += self.deliver_one(self.a) is not None
            moved += self.deliver_one(self.b) is not None
            if not moved:
                return
        raise AssertionError("link never went quiet")
