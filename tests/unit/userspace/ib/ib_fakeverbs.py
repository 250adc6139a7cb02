"""A fake verbs layer for two :class:`IbEngine` objects: one RC queue pair each way, nothing real.

What it models of RC + rdma_cm, and nothing more:
- connect: the active engine's REQ private data reaches the passive engine padded to 56 bytes, the REP's to
  196 bytes (rdma_cm hands over the whole CM area, zero padded);
- receive queue: the buffers each engine asks for (``recv_to_post``), each 48 + 4096 bytes; a SEND consumes
  the oldest one; more bytes than a buffer holds is IB_WC_LOC_LEN_ERR (the test fails: the kernel would drop
  the connection); no buffer posted is an RNR NAK (the SEND waits on the wire and is retried);
- in-order delivery of SENDs, each completing as ``recv_complete(header + fragment)``;
- send completions only for signalled WRs, after the SEND was delivered, in posting order;
- RDMA WRITE / READ work requests against the receiving side's ``regions`` (r_key -> bytearray, zero-based
  addresses), in order with the SENDs; an unknown r_key or an access outside the region fails the test.
  (Atomics are executed by the driver-level fake below, :meth:`FakeQP.post_atomic`.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pyrds.userspace.transports.ib.engine import IbEngine
from pyrds.userspace.transports.ib.events import IbEvent
from pyrds.userspace.transports.ib.frag import SendWR, WrKind
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
    #: fake registered memory of this side, by r_key (zero-based)
    regions: dict[int, bytearray] = field(default_factory=dict)
    #: RDMA ops of this side that completed: (op, bytes read)
    rdma_done: list[tuple[object, bytes]] = field(default_factory=list)


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
        if wr.kind == WrKind.RDMA:
            op = wr.rdma
            region = side.regions[op.rkey]
            assert 0 <= op.remote_addr and op.remote_addr + op.nbytes <= len(region), "remote access error"
            span = slice(op.remote_addr, op.remote_addr + op.nbytes)
            if op.write:
                region[span] = op.data
            sender_side = self.peer(side)
            sender_side.rdma_done.append((op, b"" if op.write else bytes(region[span])))
            sender_side.engine.send_complete(wr.wr_id)
            return wr
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


# -- a fake of the driver's verbs interface (pyrds.userspace.transports.ib.verbs) ----------------------------
#
# FakeFabric stands for rdma_cm + RC between any number of addresses, one process:
# - CM: ids on channels; resolve_addr/resolve_route complete at once (ADDR_RESOLVED / ROUTE_RESOLVED, or
#   ADDR_ERROR for an address in ``unreachable``); connect reaches the listener on (dst, port) as a
#   CONNECT_REQUEST (private data zero padded to 56 bytes), or REJECTED without data when nobody listens;
#   accept sends CONNECT_RESPONSE (data padded to 196), reject REJECTED (with the data), establish
#   ESTABLISHED to the passive side; disconnect (or closing a connected id) DISCONNECTED to the peer; events
#   of an id that was closed are dropped (ucma cleans them up); every event is handed out acknowledged.
# - QPs: a SEND needs RTS on both ends and a posted receive buffer on the receiver (else it waits, as on an
#   RNR NAK, and is delivered when a buffer is posted); delivery is in order; a signalled send completes after
#   delivery; a SEND longer than the buffer fails the test (IB_WC_LOC_LEN_ERR); to_error flushes.
# - FakeLoop: readers are called while their fd has something pending; timers run when nothing else does.

import ipaddress  # noqa: E402
import itertools  # noqa: E402
from collections.abc import Callable  # noqa: E402

from pyrds.userspace.transports.ib.verbs import (  # noqa: E402
    CmEvent,
    CmEventKind,
    Completion,
    ConnParams,
    QpConfig,
    VerbsError,
    WcOpcode,
    WcStatus,
)


class FakeFabric:
    def __init__(self) -> None:
        self._fds = itertools.count(1000)
        self._qpns = itertools.count(0x11)
        self._rkeys = itertools.count(0x1000)
        self.listeners: dict[tuple[str, int], FakeCmId] = {}
        self.by_fd: dict[int, FakeChannel | FakeQP] = {}
        self.unreachable: set[str] = set()
        self.qps: list[FakeQP] = []
        #: the addresses with an RDMA device (``addr_device``), and the device of each
        self.devices: dict[str, str] = {}
        self.addr_checks: list[str] = []
        #: what listen() on a bound (addr, port) fails with (98 EADDRINUSE; rdma_cm says 99 EADDRNOTAVAIL)
        self.listen_errno = 98

    def fd(self, obj: FakeChannel | FakeQP) -> int:
        fd = next(self._fds)
        self.by_fd[fd] = obj
        return fd

    def pending(self, fd: int) -> bool:
        obj = self.by_fd.get(fd)
        return obj is not None and obj.pending()

    def verbs(self) -> FakeVerbs:
        return FakeVerbs(self)


class FakeVerbs:
    def __init__(self, fabric: FakeFabric) -> None:
        self.fabric = fabric
        self.channels: list[FakeChannel] = []

    def create_channel(self) -> FakeChannel:
        ch = FakeChannel(self.fabric)
        self.channels.append(ch)
        return ch

    def addr_device(self, addr: str) -> str | None:
        self.fabric.addr_checks.append(addr)
        return self.fabric.devices.get(addr)


class FakeChannel:
    def __init__(self, fabric: FakeFabric) -> None:
        self.fabric = fabric
        self._fd = fabric.fd(self)
        self.events: deque[tuple[FakeCmId, CmEvent]] = deque()
        self.closed = False

    def fileno(self) -> int:
        return self._fd

    def pending(self) -> bool:
        return any(not target.closed for target, _ in self.events)

    def post(
        self, target: FakeCmId, kind: CmEventKind, data: bytes = b"", request: FakeCmId | None = None
    ) -> None:
        self.events.append((target, CmEvent(kind, data, request, int(kind))))

    def get_event(self) -> CmEvent | None:
        assert not self.closed
        while self.events:
            target, ev = self.events.popleft()
            if not target.closed:
                return ev
        return None

    def create_id(self) -> FakeCmId:
        return FakeCmId(self)

    def close(self) -> None:
        self.closed = True


class FakeCmId:
    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel
        self.fabric = channel.fabric
        self.closed = False
        self.src = ""
        self.dst = ""
        self.port = 0
        self.listening: tuple[str, int] | None = None
        self.peer: FakeCmId | None = None  # the other end of a request/connection
        self.qp: FakeQP | None = None
        self.connected = False
        self.sent_private: bytes = b""
        self.rejected_with: bytes | None = None
        self.calls: list[str] = []
        self.is_request = False

    def _event(self, kind: CmEventKind, data: bytes = b"", request: FakeCmId | None = None) -> None:
        self.channel.post(self, kind, data, request)

    def resolve_addr(self, src: str, dst: str, port: int, timeout_ms: int) -> None:
        self.calls.append("resolve_addr")
        self.src, self.dst, self.port = src, dst, port
        self._event(CmEventKind.ADDR_ERROR if dst in self.fabric.unreachable else CmEventKind.ADDR_RESOLVED)

    def resolve_route(self, timeout_ms: int) -> None:
        self.calls.append("resolve_route")
        self._event(CmEventKind.ROUTE_RESOLVED)

    def listen(self, addr: str, port: int, backlog: int) -> None:
        if (addr, port) in self.fabric.listeners:
            raise VerbsError("rdma_bind_addr: address in use", self.fabric.listen_errno)
        self.fabric.listeners[(addr, port)] = self
        self.listening = (addr, port)

    def create_qp(self, config: QpConfig) -> FakeQP:
        assert self.qp is None
        self.qp = FakeQP(self.fabric, config, self.src, self.dst)
        return self.qp

    def connect(self, params: ConnParams) -> None:
        self.calls.append("connect")
        assert self.qp is not None and self.qp.state == "INIT"
        self.sent_private = params.private_data
        listener = self.fabric.listeners.get((self.dst, self.port))
        if listener is None or listener.closed:
            self._event(CmEventKind.REJECTED)
            return
        request = FakeCmId(listener.channel)
        request.is_request = True
        request.peer = self
        request.src, request.dst, request.port = self.dst, self.src, self.port
        self.peer = request
        listener._event(CmEventKind.CONNECT_REQUEST, params.private_data.ljust(REQ_AREA, b"\0"), request)

    def accept(self, params: ConnParams) -> None:
        self.calls.append("accept")
        assert self.peer is not None and self.qp is not None and self.qp.state == "RTS"
        assert params.rnr_retry == 7
        self.sent_private = params.private_data
        active = self.peer
        assert active.qp is not None
        self.qp.peer, active.qp.peer = active.qp, self.qp
        self.connected = True
        active._event(CmEventKind.CONNECT_RESPONSE, params.private_data.ljust(CM_PRIVATE_DATA_MAX, b"\0"))

    def reject(self, data: bytes) -> None:
        self.calls.append("reject")
        self.rejected_with = data
        if self.peer is not None:
            self.peer._event(CmEventKind.REJECTED, data)
            self.peer = None

    def establish(self) -> None:
        self.calls.append("establish")
        assert self.peer is not None and self.qp is not None and self.qp.state == "RTS"
        self.connected = True
        self.peer._event(CmEventKind.ESTABLISHED)

    def disconnect(self) -> None:
        self.calls.append("disconnect")
        if self.connected and self.peer is not None:
            self.connected = False
            self.peer.connected = False
            self.peer._event(CmEventKind.DISCONNECTED)

    def close(self) -> None:
        if self.closed:
            return
        self.calls.append("close")
        if self.connected:
            self.disconnect()  # rdma_destroy_id on a connected id sends a DREQ
        elif self.is_request and self.peer is not None and self.rejected_with is None:
            self.peer._event(CmEventKind.REJECTED)  # destroying an unanswered request sends a REJ
        if self.listening is not None:
            self.fabric.listeners.pop(self.listening, None)
        self.closed = True


def roce_gid(addr: str) -> bytes:
    """The GID RoCE v2 gives an address: IPv4 as ``::ffff:a.b.c.d``, IPv6 as itself; zeros for no address."""
    if not addr:
        return bytes(16)
    ip = ipaddress.ip_address(addr)
    return bytes(10) + b"\xff\xff" + ip.packed if ip.version == 4 else ip.packed


class FakeQP:
    #: rxe's max_sge (RXE_MAX_SGE)
    device_max_sge = 32

    def __init__(self, fabric: FakeFabric, config: QpConfig, src: str = "", dst: str = "") -> None:
        self.fabric = fabric
        self.config = config
        self.src, self.dst = src, dst
        self.qp_num = next(fabric._qpns)
        self._fd = fabric.fd(self)
        self.state = "RESET"
        self.peer: FakeQP | None = None
        self.posted: deque[int] = deque()
        self.bufs: dict[int, bytes] = {}
        self.cq: list[Completion] = []
        self.waiting: deque[tuple[FakeQP, int, int, bytes, bool]] = deque()  # SENDs waiting for a buffer
        self.sent: list[tuple[int, int, bytes, bool, bool]] = []  # (slot, wr_id, data, signaled, solicited)
        self.closed = False
        #: registered memory (this QP's PD): r_key -> region
        self.regions: dict[int, FakeRegion] = {}
        self.rdma_posted: list[tuple[int, bool, int, int, int]] = []  # (wr_id, write, len, rkey, raddr)
        self.broken = False
        #: called with (r_key, the word's address, fetch_add) right before an atomic of this QP executes
        #: (another requester's atomic on the word between the steps of a chain, a region going away ...)
        self.before_atomic: Callable[[int, int, bool], None] | None = None
        fabric.qps.append(self)

    def fileno(self) -> int:
        return self._fd

    def pending(self) -> bool:
        return bool(self.cq) and not self.closed

    def to_init(self) -> None:
        assert self.state == "RESET"
        self.state = "INIT"

    def to_rts(self) -> None:
        assert self.state == "INIT"
        self.state = "RTS"

    def gids(self) -> tuple[bytes, bytes]:
        if self.state != "RTS":
            return bytes(16), bytes(16)
        return roce_gid(self.src), roce_gid(self.dst)

    def to_error(self) -> None:
        self.state = "ERR"
        while self.posted:
            self.cq.append(Completion(self.posted.popleft(), WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0))

    def post_recv(self, slot: int) -> None:
        assert not self.closed and self.state in ("INIT", "RTS")
        assert 0 <= slot < self.config.recv_slots and slot not in self.posted, f"slot {slot} posted twice"
        self.posted.append(slot)
        self.deliver_waiting()

    def post_send(self, slot: int, wr_id: int, data: bytes, signaled: bool, solicited: bool) -> None:
        assert not self.closed
        if self.state != "RTS":
            raise VerbsError(f"post_send in {self.state}", 22)
        assert 0 <= slot < self.config.send_slots
        assert len(data) <= self.config.recv_buf_size, f"IB_WC_LOC_LEN_ERR: SEND of {len(data)} bytes"
        if self.broken:
            self.cq.append(Completion(wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.SEND, 0))
            return
        self.sent.append((slot, wr_id, data, signaled, solicited))
        if self.peer is None:
            return
        self.peer.waiting.append((self, wr_id, 0, data, signaled))
        self.peer.deliver_waiting()

    def deliver_waiting(self) -> None:
        while self.waiting and self.posted and self.state == "RTS" and not self.closed:
            sender, wr_id, _, data, signaled = self.waiting.popleft()
            self.inject(data)
            if signaled and not sender.closed:
                sender.cq.append(Completion(wr_id, WcStatus.SUCCESS, WcOpcode.SEND, len(data)))

    def inject(
        self,
        data: bytes,
        *,
        byte_len: int | None = None,
        wr_id: int | None = None,
        status: int = WcStatus.SUCCESS,
        opcode: int = WcOpcode.RECV,
    ) -> None:
        """A receive completion as a (possibly lying) device would report it."""
        slot = self.posted.popleft() if self.posted else -1
        self.bufs[slot] = data
        n = len(data) if byte_len is None else byte_len
        self.cq.append(Completion(slot if wr_id is None else wr_id, status, opcode, n))

    def reg_mr(self, length: int, remote: bool) -> FakeRegion:
        assert not self.closed and length > 0
        region = FakeRegion(self, next(self.fabric._rkeys), length, remote)
        self.regions[region.key] = region
        return region

    def post_rdma(
        self,
        wr_id: int,
        write: bool,
        local: FakeRegion,
        length: int,
        rkey: int,
        remote_addr: int,
        fence: bool,
    ) -> None:
        """Done at once against the peer's region (so before any SEND posted after it, as RC orders them);
        a bad r_key or range is a remote access error: the completion says so and the QP goes to ERR."""
        assert not self.closed and local.qp is self and not local.closed and length <= local.length
        if self.state != "RTS":
            raise VerbsError(f"post_send in {self.state}", 22)
        self.rdma_posted.append((wr_id, write, length, rkey, remote_addr))
        opcode = WcOpcode.RDMA_WRITE if write else WcOpcode.RDMA_READ
        target = self.peer.regions.get(rkey) if self.peer is not None else None
        if (
            target is None
            or target.closed
            or not target.remote
            or remote_addr < 0
            or remote_addr + length > target.length
        ):
            self.cq.append(Completion(wr_id, WcStatus.REM_ACCESS_ERR, opcode, 0))
            self.broken = True  # what is posted after it is flushed, as the QP is in ERR by then
            return
        if write:
            target.buf[remote_addr : remote_addr + length] = local.buf[:length]
        else:
            local.buf[:length] = target.buf[remote_addr : remote_addr + length]
        self.cq.append(Completion(wr_id, WcStatus.SUCCESS, opcode, length))

    def post_atomic(
        self,
        wr_id: int,
        fetch_add: bool,
        local: FakeRegion,
        rkey: int,
        remote_addr: int,
        compare_add: int,
        swap: int,
        fence: bool,
    ) -> None:
        """Done at once, as :meth:`post_rdma`: the 8-byte little-endian word at ``remote_addr`` (8-byte
        aligned, in a region the peer registered for remote access, else a remote access error) gets the add
        (modulo 2^64) or, if it equals ``compare_add``, the swap; its original value goes to ``local``
        (what rdma_rxe's responder and completer do). :attr:`before_atomic` runs first."""
        assert not self.closed and local.qp is self and not local.closed and local.length >= 8
        if self.state != "RTS":
            raise VerbsError(f"post_send in {self.state}", 22)
        self.rdma_posted.append((wr_id, "fadd" if fetch_add else "cswp", 8, rkey, remote_addr))
        opcode = WcOpcode.FETCH_ADD if fetch_add else WcOpcode.COMP_SWAP
        if self.before_atomic is not None:
            self.before_atomic(rkey, remote_addr, fetch_add)
        target = self.peer.regions.get(rkey) if self.peer is not None else None
        aligned = not remote_addr & 7 and remote_addr + 8 <= (target.length if target is not None else 0)
        if target is None or target.closed or not target.remote or not aligned:
            self.cq.append(Completion(wr_id, WcStatus.REM_ACCESS_ERR, opcode, 0))
            self.broken = True
            return
        old = int.from_bytes(target.buf[remote_addr : remote_addr + 8], "little")
        if fetch_add:
            new = (old + compare_add) & ((1 << 64) - 1)
        else:
            new = swap if old == compare_add else old
        target.buf[remote_addr : remote_addr + 8] = new.to_bytes(8, "little")
        local.buf[:8] = old.to_bytes(8, "little")
        self.cq.append(Completion(wr_id, WcStatus.SUCCESS, opcode, 8))

    def read_recv(self, slot: int, length: int) -> bytes:
        assert 0 <= slot < self.config.recv_slots and 0 <= length <= self.config.recv_buf_size
        return self.bufs.get(slot, b"")[:length].ljust(length, b"\0")

    def completions(self) -> list[Completion]:
        out, self.cq = self.cq, []
        return out

    def close(self) -> None:
        self.closed = True


class FakeRegion:
    """Registered memory of a fake QP (zero-based; ``remote``: peers may read and write it)."""

    def __init__(self, qp: FakeQP, key: int, length: int, remote: bool) -> None:
        self.qp, self.key, self.length, self.remote = qp, key, length, remote
        self.buf = bytearray(length)
        self.closed = False

    def read(self, offset: int, length: int) -> bytes:
        assert not self.closed and 0 <= offset and offset + length <= self.length
        return bytes(self.buf[offset : offset + length])

    def write(self, offset: int, data: bytes) -> None:
        assert not self.closed and 0 <= offset and offset + len(data) <= self.length
        self.buf[offset : offset + len(data)] = data

    def close(self) -> None:
        self.closed = True
        self.qp.regions.pop(self.key, None)


class FakeLoop:
    """Readers run while their fd has work; timers (virtual time in ``clock``) when nothing else does."""

    def __init__(self, fabric: FakeFabric, clock: Clock) -> None:
        self.fabric = fabric
        self.clock = clock
        self.readers: dict[int, Callable[[], None]] = {}
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def add_reader(self, fd: int, cb: Callable[[], None]) -> None:
        assert fd not in self.readers, f"fd {fd} registered twice"
        self.readers[fd] = cb

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)

    def call_later(self, delay: float, cb: Callable[[], None]) -> None:
        self.timers.append((self.clock.t + delay, next(self._seq), cb))
        self.timers.sort(key=lambda t: (t[0], t[1]))

    def step(self, timers: bool = True) -> bool:
        """Run one ready reader (or, if none, the next timer); False when there was nothing to do."""
        ready = [cb for fd, cb in list(self.readers.items()) if self.fabric.pending(fd)]
        if ready:
            self.clock.tick()
            ready[0]()
            return True
        if timers and self.timers:
            when, _, cb = self.timers.pop(0)
            self.clock.t = max(self.clock.t, when)
            cb()
            return True
        return False

    def run(self, limit: int = 100_000, timers: bool = True) -> None:
        for _ in range(limit):
            if not self.step(timers):
                return
        raise AssertionError("loop never went quiet")
