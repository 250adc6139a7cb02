"""The RDS/IB verbs driver (driver.IbConnection / IbListener, node.IbNode) over the fake verbs fabric."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from ib_fakeverbs import Clock, FakeCmId, FakeFabric, FakeLoop, FakeQP

from pyrds.constants import RDS_HEADER_SIZE, HeaderFlag
from pyrds.userspace.proto import CongMapReceived, MessageReceived, PathState, RDSHeader
from pyrds.userspace.transports.ib.driver import ConnState, IbConnection
from pyrds.userspace.transports.ib.events import IbEvent, MessagesAcked
from pyrds.userspace.transports.ib.frag import sealed_header
from pyrds.userspace.transports.ib.node import IbNode
from pyrds.userspace.transports.ib.privdata import REJ_CONSUMER_DATA, ConnectPrivate
from pyrds.userspace.transports.ib.verbs import CmEventKind, WcOpcode, WcStatus
from pyrds.userspace.transports.ib.wire import ACK_WR_ID, RDS_IB_PORT, RECV_BUF_SIZE

A = "10.1.0.1"
B = "10.1.0.2"
SMALL = {"send_wr": 8, "recv_wr": 16}


class Net:
    """Two nodes (A dials, B listens) on one fake fabric and loop, recording what each received."""

    def __init__(self, listen_a: bool = False, **engine_kwargs: int) -> None:
        self.fabric = FakeFabric()
        self.clock = Clock()
        self.loop = FakeLoop(self.fabric, self.clock)
        self.got: dict[str, list[tuple[ipaddress.IPv4Address, IbEvent]]] = {A: [], B: []}
        kw = dict(SMALL, **engine_kwargs)
        self.a = self.node(A, listen_a, kw)
        self.b = self.node(B, True, kw)

    def node(self, addr: str, listen: bool, kw: dict[str, int]) -> IbNode:
        def sink(peer: ipaddress.IPv4Address, events: list[IbEvent]) -> None:
            self.got[addr].extend((peer, e) for e in events)

        node = IbNode(
            self.fabric.verbs(),
            self.loop,
            addr,
            on_events=sink,
            listen=listen,
            clock=self.clock.tick,
            engine_kwargs=dict(kw),
        )
        node.start()
        return node

    def messages(self, addr: str) -> list[MessageReceived]:
        return [e for _, e in self.got[addr] if isinstance(e, MessageReceived)]

    def acked(self, addr: str) -> list[int]:
        return [m.seq for _, e in self.got[addr] if isinstance(e, MessagesAcked) for m in e.messages]

    def qp(self, node: IbNode, peer: str) -> FakeQP:
        conn = node.connection(peer)
        assert conn is not None and isinstance(conn.qp, FakeQP)
        return conn.qp

    def connected(self) -> tuple[IbConnection, IbConnection]:
        self.a.connect(B)
        self.loop.run()
        ca, cb = self.a.connection(B), self.b.connection(A)
        assert ca is not None and cb is not None
        assert ca.state == cb.state == ConnState.UP
        return ca, cb


def payload(n: int, salt: int = 0) -> bytes:
    return bytes((i * 13 + salt) & 0xFF for i in range(n))


def test_connect_active_and_passive() -> None:
    net = Net()
    ca, cb = net.connected()
    assert ca.active and not cb.active
    assert ca.engine.state == cb.engine.state == PathState.UP
    assert ca.engine.version == cb.engine.version == 0x0301
    cmid = ca.cmid
    assert isinstance(cmid, FakeCmId)
    assert cmid.calls == ["resolve_addr", "resolve_route", "connect", "establish"]
    assert (cmid.dst, cmid.port) == (B, RDS_IB_PORT)
    req = ConnectPrivate.parse(cmid.sent_private, ipv6=False)
    assert (str(req.saddr), str(req.daddr), req.major, req.minor, req.minor_mask) == (A, B, 3, 1, 3)
    assert len(cmid.sent_private) == 32
    # both QPs in RTS with the whole receive ring posted; both sides got the other's congestion map
    for qp in (net.qp(net.a, B), net.qp(net.b, A)):
        assert qp.state == "RTS"
        assert len(qp.posted) == SMALL["recv_wr"] or len(qp.posted) > SMALL["recv_wr"] // 2
    assert any(isinstance(e, CongMapReceived) for _, e in net.got[A])
    assert any(isinstance(e, CongMapReceived) for _, e in net.got[B])
    assert net.b.listener is not None and net.b.listener.passive is cb


@pytest.mark.parametrize("size", [0, 1, 4096, 4097, 64 * 1024])
def test_send_multi_fragment_message(size: int) -> None:
    net = Net()
    net.connected()
    qa = net.qp(net.a, B)
    before = len(qa.sent)
    data = payload(size)
    seq = net.a.send(B, 4000, 5000, data)
    net.loop.run()
    got = net.messages(B)
    assert [(m.header.sequence, m.header.sport, m.header.dport, m.payload) for m in got] == [
        (seq, 4000, 5000, data)
    ]
    frames = [s for s in qa.sent[before:] if s[1] != ACK_WR_ID]
    nfrags = max(1, -(-size // 4096))
    assert len(frames) == nfrags
    for i, (slot, wr_id, raw, _signaled, solicited) in enumerate(frames):
        assert slot == wr_id % SMALL["send_wr"]
        assert len(raw) == (RECV_BUF_SIZE if i < nfrags - 1 else RDS_HEADER_SIZE + size - 4096 * (nfrags - 1))
        assert solicited == (i == nfrags - 1)
        h = RDSHeader.decode(raw[:RDS_HEADER_SIZE])
        assert (h.sequence, h.length) == (seq, size)
    # the first message after connect carries ACK_REQUIRED: B answers with an ACK frame, A releases it
    assert RDSHeader.decode(frames[0][2][:RDS_HEADER_SIZE]).flags & HeaderFlag.ACK_REQUIRED
    assert seq in net.acked(A)
    assert net.a.engines[ipaddress.IPv4Address(B)].path.queued_msgs == 0


def test_many_messages_refill_ring_and_both_directions() -> None:
    net = Net()
    net.connected()
    sent_ab = [net.a.send(B, 1, 2, payload(5000, i)) for i in range(20)]
    sent_ba = [net.b.send(A, 2, 1, payload(3, i)) for i in range(20)]
    net.loop.run()
    assert [m.header.sequence for m in net.messages(B)] == sent_ab
    assert [m.payload for m in net.messages(B)] == [payload(5000, i) for i in range(20)]
    assert [m.header.sequence for m in net.messages(A)] == sent_ba
    ca = net.a.connection(B)
    assert ca is not None and ca.counters["ib_recv_ring_mismatch"] == 0
    assert ca.state == ConnState.UP


def test_request_rejected_by_the_node() -> None:
    net = Net()
    net.b.max_peers = 0
    net.a.connect(B)
    net.loop.run(timers=False)
    assert net.a.connection(B) is None
    assert net.a.closed[-1] == (ipaddress.IPv4Address(B), "rejected")
    assert net.b.counters["ib_request_too_many_peers"] == 1
    assert net.b.connection(A) is None
    eng = net.a.engines[ipaddress.IPv4Address(B)]
    assert eng.state == PathState.DOWN


def test_reject_carries_the_kernel_consumer_data() -> None:
    net = Net()
    # A's request names another destination address than B's: B's node rejects it with int 1
    listener = net.b.listener
    assert listener is not None
    requests: list[FakeCmId] = []
    orig = listener.on_request

    def spy(ev):  # type: ignore[no-untyped-def]
        assert isinstance(ev.request, FakeCmId)
        requests.append(ev.request)
        return orig(ev)

    listener.on_request = spy
    net.a.max_peers = 2
    eng = net.a.engine(B)
    eng.laddr = ipaddress.IPv4Address("10.1.0.9")  # the REQ's saddr
    eng.faddr = ipaddress.IPv4Address("10.1.0.8")  # the REQ's daddr: not B
    conn = IbConnection.dial(net.a.verbs, eng, net.loop, net.a, net.clock.tick)
    assert isinstance(conn.cmid, FakeCmId)
    conn.cmid.dst = B
    net.loop.fabric.listeners[("10.1.0.8", RDS_IB_PORT)] = net.loop.fabric.listeners[(B, RDS_IB_PORT)]
    net.loop.run(timers=False)
    assert [r.rejected_with for r in requests] == [REJ_CONSUMER_DATA]
    assert REJ_CONSUMER_DATA == struct.pack("<i", 1)
    assert net.b.counters["ib_request_not_ours"] == 1
    assert conn.state == ConnState.CLOSED and conn.close_reason == "rejected"


def test_no_listener_and_unreachable() -> None:
    net = Net()
    net.a.connect("10.1.0.77")
    net.loop.run(timers=False)
    assert net.a.closed[-1] == (ipaddress.IPv4Address("10.1.0.77"), "rejected")
    net.fabric.unreachable.add("10.1.0.78")
    net.a.connect("10.1.0.78")
    net.loop.run(timers=False)
    assert net.a.closed[-1] == (ipaddress.IPv4Address("10.1.0.78"), "addr_error")


def test_peer_disconnect_then_redial_and_retransmit() -> None:
    net = Net()
    ca, cb = net.connected()
    # a message B never acknowledges at the RDS level: ring it up on A's QP but cut the wire first
    qa = net.qp(net.a, B)
    qa.peer = None
    seq = net.a.send(B, 7, 8, b"lost on the wire")
    net.loop.run(timers=False)
    assert net.messages(B) == []
    cb.close("peer goes away")
    net.loop.run(timers=False)
    assert ca.state == ConnState.CLOSED and ca.close_reason == "disconnected"
    assert ca.engine.state == PathState.DOWN and cb.engine.state == PathState.DOWN
    assert net.a.connection(B) is None
    assert qa.state == "ERR" and qa.closed
    # A still holds the message: it redials (timer) and retransmits it, flagged RETRANSMITTED
    net.loop.run()
    ca2 = net.a.connection(B)
    assert ca2 is not None and ca2 is not ca and ca2.state == ConnState.UP
    got = net.messages(B)
    assert [(m.header.sequence, m.payload) for m in got] == [(seq, b"lost on the wire")]
    assert got[0].header.flags & HeaderFlag.RETRANSMITTED


def test_stale_connection_replaced_by_a_new_request() -> None:
    net = Net()
    ca, cb = net.connected()
    # A's process dies without a DREQ; a new A dials again
    for fd in list(net.loop.readers):
        if fd in (ca._qp_fd, ca._ch_fd):
            net.loop.remove_reader(fd)
    a2 = net.node(A, False, dict(SMALL))
    seq = a2.send(B, 1, 2, b"hello again")
    net.loop.run(timers=False)
    # B drops the stale connection and rejects (the kernel's ib_listen_closed_stale) ...
    assert cb.state == ConnState.CLOSED and cb.close_reason.startswith("stale")
    assert cb.engine.counters["ib_listen_closed_stale"] == 1
    assert a2.closed[-1] == (ipaddress.IPv4Address(B), "rejected")
    # ... and A's redial (it has a message queued) gets through
    net.loop.run()
    c2 = a2.connection(B)
    assert c2 is not None and c2.state == ConnState.UP
    assert [m.payload for m in net.messages(B)] == [b"hello again"]
    assert net.messages(B)[0].header.sequence == seq


def bad_header_frame() -> bytes:
    raw = bytearray(sealed_header(RDSHeader(sequence=1, ack=0, length=1, sport=1, dport=2, flags=0)))
    raw[30] ^= 0xFF  # break the checksum
    return bytes(raw) + b"x"


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("bad_checksum", "protocol error: bad_checksum"),
        ("short", "protocol error: short_frame"),
        ("too_long", "protocol error: receive of"),
        ("unposted_slot", "receive completion for slot"),
        ("bad_opcode", "protocol error: bad_opcode"),
        ("wc_error", "receive completion wc status"),
        ("unknown_send", "bad send completion"),
    ],
)
def test_hostile_completions_drop_the_connection(kind: str, reason: str) -> None:
    net = Net()
    ca, cb = net.connected()
    qb = net.qp(net.b, A)
    if kind == "bad_checksum":
        qb.inject(bad_header_frame())
    elif kind == "short":
        qb.inject(b"\0" * 10)
    elif kind == "too_long":
        qb.inject(b"\0" * 48, byte_len=RECV_BUF_SIZE + 1)
    elif kind == "unposted_slot":
        qb.inject(b"\0" * 48, wr_id=10_000)
    elif kind == "bad_opcode":
        qb.inject(bad_header_frame(), opcode=WcOpcode.RECV_RDMA_WITH_IMM)
    elif kind == "wc_error":
        qb.inject(b"", status=12)
    elif kind == "unknown_send":
        from pyrds.userspace.transports.ib.verbs import Completion

        qb.cq.append(Completion(12345, WcStatus.SUCCESS, WcOpcode.SEND, 48))
    net.loop.run(timers=False)
    assert cb.state == ConnState.CLOSED, cb.counters
    assert cb.close_reason.startswith(reason), cb.close_reason
    assert cb.engine.state == PathState.DOWN
    assert qb.closed
    # the peer hears the disconnect and goes down too; nothing raised on the way
    assert ca.state == ConnState.CLOSED and ca.close_reason == "disconnected"


def test_data_overtaking_the_rtu_brings_the_passive_side_up() -> None:
    net = Net()
    net.a.connect(B)
    # run until B accepted, then deliver A's frames before B's ESTABLISHED event
    lst = net.b.listener
    assert lst is not None
    for _ in range(100):
        net.loop.step(timers=False)
        if lst.passive is not None and lst.passive.state == ConnState.ACCEPTING:
            break
    cb = lst.passive
    assert cb is not None and cb.state == ConnState.ACCEPTING
    assert lst.channel is not None
    # let only A work (CONNECT_RESPONSE -> establish + congestion map), never B's channel
    b_channel_fd = lst.channel.fileno()
    saved = net.loop.readers.pop(b_channel_fd)
    net.loop.run(timers=False)
    assert cb.state == ConnState.UP
    assert any(isinstance(e, CongMapReceived) for _, e in net.got[B])
    net.loop.readers[b_channel_fd] = saved
    net.loop.run(timers=False)  # the late ESTABLISHED changes nothing
    assert cb.state == ConnState.UP and cb.counters["cm_established"] == 1
    seq = net.a.send(B, 1, 1, b"after")
    net.loop.run(timers=False)
    assert [m.header.sequence for m in net.messages(B)] == [seq]
    assert cb.counters["ib_recv_ring_mismatch"] == 0


def test_listener_port_in_use() -> None:
    from pyrds.userspace.transports.ib.verbs import VerbsError

    net = Net()
    dup = IbNode(net.fabric.verbs(), net.loop, B, listen=True, clock=net.clock.tick)
    with pytest.raises(VerbsError):
        dup.start()
    assert dup.listener is None


def test_cm_event_kinds_map_unknown_values() -> None:
    assert CmEventKind.of(9) == CmEventKind.ESTABLISHED
    assert CmEventKind.of(12) == CmEventKind.OTHER


def test_find_new_fd_picks_the_one_new_link() -> None:
    from pyrds.userspace.transports.ib.pyverbs_backend import find_new_fd
    from pyrds.userspace.transports.ib.verbs import VerbsError

    cm = "/dev/infiniband/rdma_cm"
    before = {0: "/dev/null", 3: cm}
    assert find_new_fd(before, {**before, 5: "/dev/infiniband/uverbs0", 6: cm}, cm) == 6
    # an fd number reused for the channel counts as new; no new fd or two of them is an error
    assert find_new_fd({4: "pipe:[1]"}, {4: cm}, cm) == 4
    with pytest.raises(VerbsError):
        find_new_fd(before, dict(before), cm)
    with pytest.raises(VerbsError):
        find_new_fd(before, {**before, 6: cm, 7: cm}, cm)


def test_importing_the_driver_does_not_import_pyverbs() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pyrds, pyrds.userspace.transports.ib.node, pyrds.userspace.transports.ib.driver\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'pyverbs'], 'pyverbs imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
