"""The shared page's sync point (rpc.PAGE_SYNC_AT): while a socket is congested or a transport waits for its
queue to drain, a client reports synchronously only the reads from the one that can end that state; every
read before it is reported without waiting. The invariant checked here: no read the client would report
without waiting changes congestion or resumes a held transport."""

from __future__ import annotations

import ipaddress

from pyrds.constants import Transport
from pyrds.userspace import rpc
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.resources import RECV_MSG_OVERHEAD, recv_cap
from pyrds.userspace.stack.sockstate import Incoming, SockState
from tests.unit.userspace.fakes import PageSink

LOCAL = ipaddress.ip_address("127.0.0.1")
PEER = ipaddress.ip_address("10.9.9.9")


class Sink(PageSink):
    """Records the sync point the stack sets."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False
        self.sync_at = 0

    def set_sync(self, flag: bool, sync_at: int = 0) -> None:
        self.flag = flag
        if flag:
            self.sync_at = sync_at


def _receiver(rcvbuf: int) -> tuple[Stack, SockState, Sink]:
    stack = Stack()
    rs = stack.open()
    stack.bind(rs, LOCAL, 0, 0)
    rs.transport = Transport.TCP  # congestion is not kept for loop sockets
    rs.rcvbuf = rcvbuf
    sink = Sink()
    rs.push = sink
    return stack, rs, sink


def _deliver(stack: Stack, rs: SockState, size: int, count: int) -> None:
    for _ in range(count):
        stack.deliver(Incoming(PEER, LOCAL, 4000, rs.bound_port, bytes(size)))


def test_the_client_and_the_stack_count_a_read_alike() -> None:
    assert rpc.PAGE_SYNC_MSG_COST == RECV_MSG_OVERHEAD


def _read_all(stack: Stack, rs: SockState, sink: Sink, watch: str) -> tuple[int, int]:
    """Read every pushed message as a client does; (reads reported without waiting while the page's flag was
    set, reads reported synchronously). Fails if a read reported without waiting changed ``watch``."""
    count = 0
    unsynced = synced = 0
    while rs.pushed:
        count += len(rs.recv_queue[0].payload) + rpc.PAGE_SYNC_MSG_COST
        sync = sink.flag and count >= sink.sync_at
        flagged = sink.flag
        before = (rs.congested, len(rs.rcv_waiters))
        stack.consume(rs, 1, False)
        after = (rs.congested, len(rs.rcv_waiters))
        if before != after:
            assert sync, f"a read reported without waiting changed {watch}: {before} -> {after}"
        if flagged:
            if sync:
                synced += 1
            else:
                unsynced += 1
    return unsynced, synced


def test_only_the_read_that_can_uncongest_the_port_is_synchronous() -> None:
    stack, rs, sink = _receiver(rcvbuf=64 * 1024)
    _deliver(stack, rs, 1024, 100)  # 100 KiB queued > 32 KiB: congested
    assert rs.congested and sink.flag
    unsynced, synced = _read_all(stack, rs, sink, "congestion")
    assert not rs.congested and not sink.flag
    assert unsynced >= 50, "reads far from the threshold should not wait"
    assert synced >= 1


def test_arrivals_between_reads_only_move_the_point_later() -> None:
    stack, rs, sink = _receiver(rcvbuf=64 * 1024)
    _deliver(stack, rs, 1024, 60)
    published = sink.sync_at
    _deliver(stack, rs, 1024, 40)  # the client has not seen a new point: the old one is early, never late
    unsynced, synced = _read_all(stack, rs, sink, "congestion")
    assert published <= sink.sync_at or not sink.flag
    assert not rs.congested and synced >= 1 and unsynced >= 1


def test_a_read_by_request_moves_the_point() -> None:
    stack, rs, sink = _receiver(rcvbuf=64 * 1024)
    _deliver(stack, rs, 1024, 100)
    rs.sync_reads()  # the point for all 100 (arrivals alone do not republish it)
    first = sink.sync_at
    rs.pushed = 0  # as if nothing was pushed: the next read is served by request
    stack.recvmsg(rs, 4096, 0, 0, True)
    assert sink.sync_at == first - 1024, "a read the client's count does not see brings the point closer"
    rs.pushed = len(rs.recv_queue)
    unsynced, synced = _read_all(stack, rs, sink, "congestion")
    assert not rs.congested and synced >= 1


def test_only_the_read_that_resumes_a_held_transport_is_synchronous() -> None:
    stack, rs, sink = _receiver(rcvbuf=8 << 20)
    size = 64 * 1024
    n = recv_cap(rs.rcvbuf) // (size + RECV_MSG_OVERHEAD) + 2
    _deliver(stack, rs, size, n)
    resumed: list[int] = []
    assert stack.hold_reader(LOCAL, rs.bound_port, 1, lambda: resumed.append(1))
    assert sink.flag
    unsynced, synced = _read_all(stack, rs, sink, "the held transport or congestion")
    assert resumed == [1]
    assert unsynced >= 1 and synced >= 1
