"""RDS_CANCEL_SENT_TO on userspace RDS/IB sockets over the fake verbs fabric, as ``rds_send_drop_to``
(net/rds/send.c) does it: the messages leave the connection (never sent, never sent again), their send-buffer
bytes are free, RDS_INFO_SEND_MESSAGES no longer lists them, an RDMA op that asked for NOTIFY_ME gets
RDS_RDMA_CANCELED once (``__rds_send_complete``), and a message delivered already stays delivered."""

from __future__ import annotations

import ctypes
from typing import Any

from test_ib_rdma import NOTIFY, RW, Rdma, iov, page_buffer
from test_ib_transport import A, B, Pair, ib_socket, ip, payload, recv_all, socket_addr

from pyrds import cmsg
from pyrds.constants import SOL_RDS, InfoType, RdmaStatus, SockOpt
from pyrds.userspace.stack import info_tables
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.sockopts import setsockopt
from pyrds.userspace.stack.sockstate import SockState


def send_rows(stack: Stack) -> list[tuple[int, int]]:
    """(seq, fport) of every RDS_INFO_SEND_MESSAGES row."""
    return [(r.seq, r.fport) for r in info_tables.records(stack, InfoType.RDS_INFO_SEND_MESSAGES)]


def cancel(stack: Stack, rs: SockState, addr: str, port: int) -> None:
    setsockopt(stack, rs, SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, socket_addr(addr, port))


def test_cancelled_messages_never_reach_the_peer_and_free_the_send_buffer() -> None:
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    b1 = ib_socket(pair.b, B, 5000)
    b2 = ib_socket(pair.b, B, 5001)
    for i in range(3):  # the connection is still being made (the loop has not run): all stay queued
        pair.a.sendmsg(sa, payload(100, i), [], 0, (ip(B), 5000), True)
    pair.a.sendmsg(sa, b"other port", [], 0, (ip(B), 5001), True)
    assert send_rows(pair.a) == [(1, 5000), (2, 5000), (3, 5000), (4, 5001)]
    assert sa.snd_bytes == 310
    cancel(pair.a, sa, B, 5000)
    assert send_rows(pair.a) == [(4, 5001)]
    assert sa.snd_bytes == 10 and pair.a.counters["send_canceled"] == 3
    pair.a.sendmsg(sa, b"after", [], 0, (ip(B), 5000), True)
    pair.loop.run()
    assert recv_all(pair.b, b1) == [(b"after", (A, 4000))]  # the sequence gap 1..3 is no error
    assert recv_all(pair.b, b2) == [(b"other port", (A, 4000))]
    assert send_rows(pair.a) == [] and sa.snd_bytes == 0
    assert pair.ib_a.nodes[ip(A)].engines[ip(B)].path.queued_msgs == 0


def test_cancel_after_delivery_changes_nothing() -> None:
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    sb = ib_socket(pair.b, B, 5000)
    pair.a.sendmsg(sa, b"delivered", [], 0, (ip(B), 5000), True)
    pair.loop.run()
    cancel(pair.a, sa, B, 5000)
    pair.loop.run()
    assert recv_all(pair.b, sb) == [(b"delivered", (A, 4000))]
    assert sa.snd_bytes == 0


def _write_args(r: Rdma, cookie: int, aaddr: int, token: int) -> object:
    return cmsg.rdma_args(cookie, 0, 64, iov(r.keep, (aaddr, 64)), 1, RW | NOTIFY, token)


def test_cancel_of_a_queued_rdma_write_posts_nothing_and_notifies_canceled_once() -> None:
    r = Rdma()
    baddr, aaddr = page_buffer(r.keep), page_buffer(r.keep)
    cookie = r.map_on_b(baddr, 4096)
    ctypes.memmove(aaddr, b"W" * 64, 64)
    r.p.ib_a.reset()  # the connection goes down: the next message waits in the send queue
    r.p.a.sendmsg(r.sa, b"wrote", [_write_args(r, cookie, aaddr, 91)], 0, (ip(B), 5000), True)
    cancel(r.p.a, r.sa, B, 5000)
    r.p.loop.run()
    assert r.notification() == [cmsg.RdmaNotify(91, RdmaStatus.CANCELED)]
    assert not r.sa.rdma_notify
    assert ctypes.string_at(baddr, 64) == bytes(64)  # the WRITE was never posted
    assert recv_all(r.p.b, r.sb) == []
    r.send(r.sa, b"next")
    assert r.recv(r.sb)[0] == b"next"


def test_cancel_of_a_posted_rdma_write_notifies_canceled_not_its_completion() -> None:
    """The op was posted with its message (the connection is up): it completes, but the socket hears only
    RDS_RDMA_CANCELED (``rds_rdma_send_complete`` finds the message off the socket)."""
    r = Rdma()
    baddr, aaddr = page_buffer(r.keep), page_buffer(r.keep)
    cookie = r.map_on_b(baddr, 4096)
    r.p.a.sendmsg(r.sa, b"wrote", [_write_args(r, cookie, aaddr, 92)], 0, (ip(B), 5000), True)
    cancel(r.p.a, r.sa, B, 5000)
    r.p.loop.run()
    assert r.notification() == [cmsg.RdmaNotify(92, RdmaStatus.CANCELED)]
    assert not r.sa.rdma_notify and r.sa.snd_bytes == 0


def test_close_cancels_all_of_a_sockets_messages_in_one_engine_call() -> None:
    """``rds_release`` -> ``rds_send_drop_to``: the messages of the closed socket, to several ports, leave
    their connection in one :meth:`IbEngine.cancel_many` (one pass over its queues, not one per message);
    another socket's message on that connection still goes out."""
    pair = Pair()
    sa = ib_socket(pair.a, A, 4000)
    other = ib_socket(pair.a, A, 4001)
    b1 = ib_socket(pair.b, B, 5000)
    b2 = ib_socket(pair.b, B, 5001)
    for i in range(6):  # the connection is still being made (the loop has not run): all stay queued
        pair.a.sendmsg(sa, payload(10, i), [], 0, (ip(B), 5000 + i % 2), True)
    pair.a.sendmsg(other, b"kept", [], 0, (ip(B), 5001), True)
    engine = pair.ib_a.nodes[ip(A)].engines[ip(B)]
    calls: list[list[int]] = []
    cancel_many = engine.cancel_many

    def counted(seqs: Any) -> Any:
        calls.append(sorted(seqs))
        return cancel_many(seqs)

    engine.cancel_many = counted  # type: ignore[method-assign]
    pair.a.close(sa)
    assert calls == [[1, 2, 3, 4, 5, 6]]
    assert send_rows(pair.a) == [(7, 5001)] and engine.path.queued_msgs == 1
    pair.loop.run()
    assert recv_all(pair.b, b1) == [] and recv_all(pair.b, b2) == [(b"kept", (A, 4001))]
