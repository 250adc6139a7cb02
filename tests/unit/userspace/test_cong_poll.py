"""rds_poll parity of the userspace stack: exact poll masks on the readiness fd, the "historical" POLLIN
after a congestion-map update (rds_cong_updated_since), cong.c's map-update rules, the kernel's counters."""

from __future__ import annotations

import errno
import ipaddress
import select
import socket

import pytest

from pyrds.constants import SOL_RDS, InfoType, SockOpt, Transport
from pyrds.info import counters_dict
from pyrds.testing.helpers import ALL_EVENTS
from pyrds.userspace import RDSSocket
from pyrds.userspace.control import stack_counters
from pyrds.userspace.proto.cong import CongestionMap
from pyrds.userspace.service.readiness import Readiness
from pyrds.userspace.stack.congestion import ALL_PORTS, CongestionTable
from pyrds.userspace.stack.counters import EXTRA_NAMES, new_counters
from pyrds.userspace.stack.sockstate import SockState

ALL = ALL_EVENTS
OUT = select.POLLOUT | select.POLLWRNORM
IN = select.POLLIN | select.POLLRDNORM

# net/rds/stats.c rds_stat_names + net/rds/tcp_stats.c rds_tcp_stat_names (7.3: 6.1's list with
# mprds_catchup_tx0_retries appended to rds_stat_names), in order
KERNEL_73 = [
    "conn_reset", "recv_drop_bad_checksum", "recv_drop_old_seq", "recv_drop_no_sock", "recv_drop_dead_sock",
    "recv_deliver_raced", "recv_delivered", "recv_queued", "recv_immediate_retry", "recv_delayed_retry",
    "recv_ack_required", "recv_rdma_bytes", "recv_ping", "send_queue_empty", "send_queue_full",
    "send_lock_contention", "send_lock_queue_raced", "send_immediate_retry", "send_delayed_retry",
    "send_drop_acked", "send_ack_required", "send_queued", "send_rdma", "send_rdma_bytes", "send_pong",
    "page_remainder_hit", "page_remainder_miss", "copy_to_user", "copy_from_user", "cong_update_queued",
    "cong_update_received", "cong_send_error", "cong_send_blocked", "recv_bytes_added_to_sock",
    "recv_bytes_freed_fromsock", "send_stuck_rm", "mprds_catchup_tx0_retries",
    "tcp_data_ready_calls", "tcp_write_space_calls", "tcp_sndbuf_full", "tcp_connect_raced",
    "tcp_listen_closed_stale",
]  # fmt: skip


def mask(fd: int, timeout_ms: int = 0) -> int:
    p = select.poll()
    p.register(fd, ALL)
    res = p.poll(timeout_ms)
    return res[0][1] if res else 0


def test_readiness_fd_masks_are_rds_poll_masks() -> None:
    """rds_poll never sets POLLWRBAND with POLLOUT (an AF_UNIX socketpair would)."""
    r = Readiness()
    try:
        assert r.tcp, "loopback TCP readiness pair unavailable"
        fd = r.client_fd()
        assert mask(fd) == OUT
        r.set_readable(True)
        r.delivered()  # as the service does before anything depends on the byte (loopback may defer it)
        assert mask(fd) == IN | OUT
        r.set_writable(False)
        assert mask(fd) == IN
        r.set_readable(False)
        assert mask(fd) == 0
        r.set_writable(True)
        assert mask(fd) == OUT
        r.set_readable(True)
        r.set_readable(False)
        assert mask(fd) == OUT
    finally:
        r.close()


def test_socket_masks_unbound_idle_readable() -> None:
    a, b = RDSSocket(), RDSSocket()
    assert mask(a.fileno()) == OUT  # unbound
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    assert mask(a.fileno()) == OUT
    a.sendto(b"x", b.getsockname())
    assert mask(b.fileno(), 1000) == IN | OUT
    b.recv(10)
    assert mask(b.fileno()) == OUT


def _tcp_on_loopback_pair(monitor: bool = False) -> tuple[RDSSocket, RDSSocket]:
    r = RDSSocket()
    r.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    r.bind(("127.0.0.1", 0))
    s = RDSSocket()
    s.bind(("127.0.0.1", 0))
    if monitor:
        s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    return r, s


def _fill(s: RDSSocket, dest: object) -> int:
    sent = 0
    with pytest.raises(OSError) as info:
        for _ in range(100):
            s.sendto(b"c" * 1000, socket.MSG_DONTWAIT, dest)
            sent += 1
    assert info.value.errno == errno.ENOBUFS
    return sent


def test_historical_pollin_after_map_update_without_monitor() -> None:
    """rds_poll: POLLIN when the map generation moved since the socket last looked; recv says EAGAIN and
    the POLLIN is consumed (the userspace stack consumes it on the socket's next send/recv)."""
    r, s = _tcp_on_loopback_pair()
    bystander = RDSSocket()
    bystander.bind(("127.0.0.1", 0))
    sent = _fill(s, r.getsockname())
    assert not mask(s.fileno()) & select.POLLIN  # nothing changed since the failed send looked
    for _ in range(sent):
        r.recv(2000)  # uncongests: the local map changes, the loop transport "sends" it (generation + 1)
    assert mask(s.fileno(), 2000) & IN == IN
    assert mask(s.fileno()) & IN == IN  # level: stays until the socket looks again
    with pytest.raises(BlockingIOError):
        s.recv(100, socket.MSG_DONTWAIT)
    assert not mask(s.fileno()) & select.POLLIN
    assert not mask(bystander.fileno()) & select.POLLIN  # never saw congestion: no poll waiter to wake
    assert s.sendto(b"ok", r.getsockname()) == 2


def test_no_historical_pollin_with_cong_monitor() -> None:
    """With RDS_CONG_MONITOR rds_poll only reports rs_cong_notify; the notification is read once."""
    r, s = _tcp_on_loopback_pair(monitor=True)
    sent = _fill(s, r.getsockname())
    for _ in range(sent):
        r.recv(2000)
    assert mask(s.fileno(), 2000) & IN == IN
    data, anc, _flags, _addr = s.recvmsg(10, 64)
    assert data == b"" and anc
    assert not mask(s.fileno()) & select.POLLIN
    with pytest.raises(BlockingIOError):
        s.recv(100, socket.MSG_DONTWAIT)


def test_cong_map_update_rules() -> None:
    """rds_tcp_cong_recv passes ~0; rds_cong_map_updated moves rs_cong_mask bits in portmask to
    rs_cong_notify and clears them from rs_cong_mask; every update bumps the generation."""
    table = CongestionTable(new_counters())
    addr = ipaddress.ip_address("10.1.2.3")
    new = CongestionMap()
    new.set(7)
    assert table.replace_remote(addr, new) == ALL_PORTS
    assert table.test(addr, 7)
    rs = SockState(1, 1 << 16, 1 << 16)
    table.monitor(rs, True)
    rs.cong_mask = 1 << 7
    gen = table.generation.value
    woken: list[SockState] = []
    table.map_updated(ALL_PORTS, woken.append)
    assert (rs.cong_notify, rs.cong_mask) == (1 << 7, 0)
    assert woken == [rs]
    assert table.generation.value == gen + 1
    assert CongestionTable.uncongested_mask(new, CongestionMap()) == 1 << 7


def test_info_counters_are_the_kernels() -> None:
    s = RDSSocket()
    names = [r.name for r in s.get_info(InfoType.RDS_INFO_COUNTERS)]
    assert names == KERNEL_73
    every = stack_counters(s)
    assert set(every) == set(KERNEL_73) | set(EXTRA_NAMES)


def test_new_loop_connection_is_a_map_update() -> None:
    """rds_connect_path_complete queues the map; the loop transport delivers it as a map update."""
    a, b = RDSSocket(), RDSSocket()
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    before = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))["cong_update_received"]
    a.sendto(b"1", b.getsockname())
    a.sendto(b"2", b.getsockname())
    after = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))["cong_update_received"]
    assert after - before == 1


def test_cong_monitor_off_clears_own_congested_port() -> None:
    """rds_cong_monitor(0) -> rds_cong_remove_socket: a congested receiver's port bit is cleared (and the
    update queued) although its queue is still full."""
    r, s = _tcp_on_loopback_pair()
    _fill(s, r.getsockname())
    r.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 0)
    assert s.sendto(b"through", socket.MSG_DONTWAIT, r.getsockname()) == 7
