"""Receive-buffer congestion, ENOBUFS, RDS_CONG_MONITOR notifications and recovery (cong.c, recv.c)."""

from __future__ import annotations

import errno
import select
import socket

from pyrds.cmsg import CongUpdate, parse_ancdata
from pyrds.constants import SOL_RDS, SockOpt, cong_monitor_mask
from pyrds.testing.helpers import drain_nonblocking, expect_errno, poll_mask, wait_readable

MSG = 1000


def _fill(sender, dest, limit=1000):
    """Send MSG-byte messages non-blocking until the destination is congested; return (sent, errno)."""
    sent = 0
    for _ in range(limit):
        try:
            sender.sendto(b"c" * MSG, socket.MSG_DONTWAIT, dest)
        except OSError as exc:
            return sent, exc.errno
        sent += 1
    return sent, None


def _small_receiver(rds_socket_factory):
    r = rds_socket_factory()
    r.setsockopt(
        socket.SOL_SOCKET, socket.SO_RCVBUF, 4096
    )  # sk_rcvbuf 8192: congested past 4096 queued bytes
    r.bind(("127.0.0.1", 0))
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    return r, s


def test_loop_bound_receiver_never_congests(rds_socket_factory, rds_observe):
    """Kernel 6.1: a socket bound on the loop transport never becomes congested ("loop transport doesn't
    send/recv congestion updates", rds_recv_rcvbuf_delta); its queue grows past rcvbuf without ENOBUFS."""
    r = rds_socket_factory()
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    r.bind(("127.0.0.1", 0))
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    sent, err = _fill(s, r.getsockname(), limit=50)
    assert (sent, err) == (50, None)
    assert len(drain_nonblocking(r)) == 50


def test_congested_receiver_enobufs(rds_socket_factory, rds_observe):
    """Once queued bytes exceed rcvbuf/2 the port is congested: a non-blocking send gets ENOBUFS."""
    r, s = _small_receiver(rds_socket_factory)
    sent, err = _fill(s, r.getsockname())
    assert err == errno.ENOBUFS, f"after {sent} sends: {err}"
    assert 4 <= sent <= 6  # 4096 // 1000 + 1 messages fit before the bit is set
    rds_observe("sent_before_enobufs", sent)
    assert len(drain_nonblocking(r)) == sent


def test_congestion_recovers_after_drain(rds_socket_factory):
    r, s = _small_receiver(rds_socket_factory)
    sent, err = _fill(s, r.getsockname())
    assert err == errno.ENOBUFS
    assert len(drain_nonblocking(r)) == sent
    # the uncongest map update is sent asynchronously by the connection worker
    for _ in range(200):
        try:
            s.sendto(b"again", socket.MSG_DONTWAIT, r.getsockname())
            break
        except OSError as exc:
            assert exc.errno == errno.ENOBUFS
            select.select([], [], [], 0.01)
    else:
        raise AssertionError("destination still congested 2 s after the receiver drained")
    r.settimeout(5)
    assert r.recv(100) == b"again"


def test_congestion_other_port_unaffected(rds_socket_factory):
    """Congestion is per destination port: another port on the same address still accepts messages."""
    r, s = _small_receiver(rds_socket_factory)
    other = rds_socket_factory()
    other.bind(("127.0.0.1", 0))
    _sent, err = _fill(s, r.getsockname())
    assert err == errno.ENOBUFS
    assert s.sendto(b"fine", socket.MSG_DONTWAIT, other.getsockname()) == 4
    drain_nonblocking(r)


def test_cong_monitor_notification(rds_socket_factory, rds_observe):
    """With RDS_CONG_MONITOR, a sender that hit ENOBUFS gets RDS_CMSG_CONG_UPDATE (u64 mask of port%64) as a
    0-byte recvmsg once the destination uncongests; POLLIN signals it."""
    r, s = _small_receiver(rds_socket_factory)
    s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    _sent, err = _fill(s, r.getsockname())
    assert err == errno.ENOBUFS
    drain_nonblocking(r)
    assert wait_readable(s, 5), "no POLLIN on the monitoring sender after the receiver drained"
    data, anc, _flags, _addr = s.recvmsg(100, socket.CMSG_SPACE(8), socket.MSG_DONTWAIT)
    assert data == b""
    parsed = parse_ancdata(anc)
    updates = [p for p in parsed if isinstance(p, CongUpdate)]
    assert updates, f"no RDS_CMSG_CONG_UPDATE in {parsed}"
    mask = cong_monitor_mask(r.getsockname()[1])
    assert updates[0].mask & mask
    rds_observe("cong_update", [u.mask == mask for u in updates])
    # notification consumed: nothing left
    try:
        s.recvmsg(100, socket.CMSG_SPACE(8), socket.MSG_DONTWAIT)
        raise AssertionError("second notification delivered")
    except OSError as exc:
        assert exc.errno == errno.EAGAIN


def test_cong_monitor_not_readable(rds_socket_factory):
    """rds_getsockopt handles only RDS_INFO_*, RDS_RECVERR and SO_RDS_TRANSPORT: CONG_MONITOR is
    ENOPROTOOPT."""
    s = rds_socket_factory()
    s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    expect_errno(errno.ENOPROTOOPT, s.getsockopt, SOL_RDS, SockOpt.RDS_CONG_MONITOR)


def test_notification_needs_ancillary_space(rds_socket_factory):
    """A CONG_UPDATE notification read with no ancillary buffer: recvmsg still returns 0 bytes, MSG_CTRUNC."""
    r, s = _small_receiver(rds_socket_factory)
    s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    _sent, err = _fill(s, r.getsockname())
    assert err == errno.ENOBUFS
    drain_nonblocking(r)
    assert wait_readable(s, 5)
    data, anc, flags, _addr = s.recvmsg(100, 0, socket.MSG_DONTWAIT)
    assert data == b"" and anc == []
    assert flags & socket.MSG_CTRUNC


def test_poll_after_congestion_without_monitor(rds_socket_factory, rds_observe):
    """Without a monitor, a congestion map change makes the sender POLLIN ("historical reasons",
    rds_poll) although
    there is nothing to read: recv gives EAGAIN."""
    r, s = _small_receiver(rds_socket_factory)
    poll_mask(s)  # consume any earlier generation change
    _sent, err = _fill(s, r.getsockname())
    assert err == errno.ENOBUFS
    drain_nonblocking(r)
    assert wait_readable(s, 5), "no POLLIN after a congestion map change"
    try:
        s.recv(100, socket.MSG_DONTWAIT)
        raise AssertionError("sender had something to read")
    except OSError as exc:
        assert exc.errno == errno.EAGAIN
