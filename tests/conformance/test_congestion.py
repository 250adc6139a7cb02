"""Receive-buffer congestion, ENOBUFS, RDS_CONG_MONITOR notifications and recovery (cong.c, recv.c).

Kernel 6.1 (verified in the guest): a loop-bound receiver never congests ("loop transport doesn't send/recv
congestion updates"); a receiver bound with SO_RDS_TRANSPORT=TCP on 127.0.0.1 does. The full congestion story
(ENOBUFS, monitor notifications, recovery, poll) is exercised between two namespaces over RDS/TCP.
"""

from __future__ import annotations

import errno
import socket
import time

import pytest

from pyrds.cmsg import CongUpdate, parse_ancdata
from pyrds.constants import SOL_RDS, SockOpt, Transport, cong_monitor_mask
from pyrds.testing.helpers import (
    drain_nonblocking,
    expect_errno,
    poll_mask,
    send_until_enobufs,
    send_when_uncongested,
    wait_readable,
)

MSG = 1000


def test_loop_bound_receiver_never_congests(rds_socket_factory):
    """Kernel 6.1: a receiver bound on the loop transport never congests (rds_recv_rcvbuf_delta skips loop):
    its queue grows past rcvbuf/2 without the sender seeing ENOBUFS."""
    r = rds_socket_factory()
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    r.bind(("127.0.0.1", 0))
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    for i in range(50):
        assert s.sendto(b"c" * MSG, socket.MSG_DONTWAIT, r.getsockname()) == MSG, i
    assert len(drain_nonblocking(r)) == 50


def test_tcp_bound_receiver_on_loopback_congests(rds_socket_factory, rds_observe):
    """Kernel 6.1 (verified in the guest): a receiver bound with SO_RDS_TRANSPORT=TCP on 127.0.0.1 does
    congest: past rcvbuf/2 queued bytes a non-blocking sender gets ENOBUFS."""
    r = rds_socket_factory()
    r.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    r.bind(("127.0.0.1", 0))
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    sent = 0
    with pytest.raises(OSError) as info:
        for _ in range(50):
            s.sendto(b"c" * MSG, socket.MSG_DONTWAIT, r.getsockname())
            sent += 1
    assert info.value.errno == errno.ENOBUFS
    assert 4 <= sent <= 6
    rds_observe("sent_before_enobufs", sent)
    assert len(drain_nonblocking(r)) == sent


def test_cong_monitor_not_readable(rds_socket_factory):
    """rds_getsockopt handles only RDS_INFO_*, RDS_RECVERR and SO_RDS_TRANSPORT: CONG_MONITOR is
    ENOPROTOOPT."""
    s = rds_socket_factory()
    s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    expect_errno(errno.ENOPROTOOPT, s.getsockopt, SOL_RDS, SockOpt.RDS_CONG_MONITOR)


# ---- over TCP between two namespaces


def _tcp_pair(nodes, monitor=False):
    na, nb = nodes.a, nodes.b
    r = nb.socket()
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # congested past 4096 queued bytes
    r.bind((nb.addr4, 0))
    s = na.socket()
    s.bind((na.addr4, 0))
    if monitor:
        s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    # establish the connection (and the initial map exchange) first
    s.sendto(b"up", r.getsockname())
    assert _recv_soon(r, 20) == b"up"
    return r, s


def _recv_soon(sock, timeout):
    """The next message, non-blocking reads after POLLIN. POLLIN alone does not mean a message on the
    kernel: the new connection's congestion-map exchange bumps rds_cong_generation, and the receiver's next
    poll shows the "historical" POLLIN (rds_poll) even when "up" is not queued yet (recv: EAGAIN)."""
    deadline = time.monotonic() + timeout
    while True:
        wait_readable(sock, max(0.1, deadline - time.monotonic()))
        try:
            return sock.recv(10, socket.MSG_DONTWAIT)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _fill(sender, dest, timeout=20.0):
    """Send non-blocking until ENOBUFS (the peer's map says congested); return messages sent."""
    sent, enobufs = send_until_enobufs(sender, dest, MSG, timeout)
    if not enobufs:
        raise AssertionError(f"no ENOBUFS after {sent} messages")
    return sent


def _drain_all(r, expect, timeout=20.0):
    got = 0
    deadline = time.monotonic() + timeout
    while got < expect and time.monotonic() < deadline:
        got += len(drain_nonblocking(r))
        if got < expect:
            wait_readable(r, 1)
    return got


def test_tcp_congestion_enobufs_and_recovery(rds_two_nodes, rds_observe):
    r, s = _tcp_pair(rds_two_nodes)
    sent = _fill(s, r.getsockname())
    assert sent >= 4
    assert _drain_all(r, sent) == sent
    send_when_uncongested(s, b"again", r.getsockname(), 20)
    assert _recv_soon(r, 20) == b"again"
    rds_observe("recovered", True)


def test_tcp_congestion_is_per_port(rds_two_nodes):
    r, s = _tcp_pair(rds_two_nodes)
    other = rds_two_nodes.b.socket()
    other.bind((rds_two_nodes.b.addr4, 0))
    sent = _fill(s, r.getsockname())
    assert s.sendto(b"fine", socket.MSG_DONTWAIT, other.getsockname()) == 4
    _drain_all(r, sent)


def test_tcp_cong_monitor_notification(rds_two_nodes, rds_observe):
    """With RDS_CONG_MONITOR, a sender that hit ENOBUFS gets RDS_CMSG_CONG_UPDATE (u64 mask, bit port%64)
    a 0-byte recvmsg once the destination uncongests; POLLIN signals it; it is delivered once."""
    r, s = _tcp_pair(rds_two_nodes, monitor=True)
    sent = _fill(s, r.getsockname())
    assert _drain_all(r, sent) == sent
    assert wait_readable(s, 20), "no POLLIN on the monitoring sender after the receiver drained"
    data, anc, _flags, _addr = s.recvmsg(100, socket.CMSG_SPACE(8), socket.MSG_DONTWAIT)
    assert data == b""
    updates = [p for p in parse_ancdata(anc) if isinstance(p, CongUpdate)]
    assert updates, f"no RDS_CMSG_CONG_UPDATE in {anc}"
    mask = cong_monitor_mask(r.getsockname()[1])
    assert updates[0].mask & mask
    rds_observe("cong_update_mask_is_port_bit", updates[0].mask == mask)
    expect_errno(errno.EAGAIN, s.recvmsg, 100, socket.CMSG_SPACE(8), socket.MSG_DONTWAIT)


def test_tcp_notification_without_ancillary_space(rds_two_nodes):
    """A CONG_UPDATE read with no ancillary buffer: 0 bytes, no ancdata, MSG_CTRUNC (put_cmsg)."""
    r, s = _tcp_pair(rds_two_nodes, monitor=True)
    sent = _fill(s, r.getsockname())
    assert _drain_all(r, sent) == sent
    assert wait_readable(s, 20)
    data, anc, flags, _addr = s.recvmsg(100, 0, socket.MSG_DONTWAIT)
    assert data == b"" and anc == []
    assert flags & socket.MSG_CTRUNC


def test_tcp_poll_after_congestion_without_monitor(rds_two_nodes):
    """Without a monitor, a congestion map change makes the sender POLLIN ("historical reasons", rds_poll)
    although there is nothing to read: recv gives EAGAIN."""
    r, s = _tcp_pair(rds_two_nodes)
    poll_mask(s)  # consume any earlier generation change
    sent = _fill(s, r.getsockname())
    assert _drain_all(r, sent) == sent
    assert wait_readable(s, 20), "no POLLIN after a congestion map change"
    expect_errno(errno.EAGAIN, s.recv, 100, socket.MSG_DONTWAIT)
