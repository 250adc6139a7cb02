"""poll/select masks on fileno(), RDS_INFO tables, and ping (dport 0) as seen through the socket API."""

from __future__ import annotations

import errno
import ipaddress
import select
import socket
import time

from pyrds.constants import SOL_RDS, InfoConnectionFlag, InfoType
from pyrds.info import counters_dict
from pyrds.testing.helpers import expect_errno, mask_names, poll_mask, wait_for, wait_readable

LO = ipaddress.ip_address("127.0.0.1")


def _settled_mask(sock):
    """poll twice: the first poll after any congestion-map generation change anywhere shows POLLIN once."""
    poll_mask(sock)
    return poll_mask(sock)


def test_poll_idle_socket_writable_not_readable(rds_pair, rds_observe):
    a, _b = rds_pair
    mask = _settled_mask(a)
    assert mask & select.POLLOUT
    assert not mask & (select.POLLIN | select.POLLHUP | select.POLLERR)
    rds_observe("idle_mask", mask_names(mask))


def test_poll_unbound_socket(rds_socket_factory, rds_observe):
    s = rds_socket_factory()
    mask = _settled_mask(s)
    assert mask & select.POLLOUT and not mask & select.POLLHUP
    rds_observe("unbound_mask", mask_names(mask))


def test_poll_readable_after_send_and_clear_after_recv(rds_pair):
    a, b = rds_pair
    a.sendto(b"p", b.getsockname())
    assert wait_readable(b, 5)
    assert poll_mask(b) & (select.POLLIN | select.POLLRDNORM) == select.POLLIN | select.POLLRDNORM
    b.recv(10)
    assert wait_for(lambda: not _settled_mask(b) & select.POLLIN, 2)


def test_select_on_fileno(rds_pair):
    a, b = rds_pair
    r, w, _x = select.select([b.fileno()], [a.fileno()], [], 0)
    assert w == [a.fileno()]
    a.sendto(b"s", b.getsockname())
    r, _w, _x = select.select([b.fileno()], [], [], 5)
    assert r == [b.fileno()]


def test_poll_after_close_is_nval(rds_socket_factory):
    s = rds_socket_factory()
    fd = s.fileno()
    s.close()
    p = select.poll()
    p.register(fd, select.POLLIN)
    assert p.poll(0) == [(fd, select.POLLNVAL)]


# ---- info tables


def test_info_counters(rds_socket_factory, rds_observe):
    s = rds_socket_factory()
    counters = counters_dict(s.get_info(InfoType.RDS_INFO_COUNTERS))
    for name in (
        "conn_reset",
        "recv_delivered",
        "recv_queued",
        "send_queued",
        "recv_ping",
        "send_pong",
        "cong_update_queued",
        "cong_update_received",
        "cong_send_error",
    ):
        assert name in counters, name
    assert all(v >= 0 for v in counters.values())
    rds_observe("core_counter_names", sorted(n for n in counters if not n.startswith(("tcp_", "ib_", "iw_"))))


def test_info_counters_move(rds_pair):
    a, b = rds_pair
    before = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    for _ in range(5):
        a.sendto(b"c", b.getsockname())
    for _ in range(5):
        b.recv(10)
    after = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    assert after["recv_delivered"] - before["recv_delivered"] >= 5
    assert after["copy_to_user"] - before["copy_to_user"] >= 5


def test_info_sockets_lists_ours(rds_pair):
    a, b = rds_pair
    b.connect(a.getsockname())
    recs = a.get_info(InfoType.RDS_INFO_SOCKETS)
    ports = {r.bound_port: r for r in recs if r.bound_addr == LO}
    ra, rb = ports[a.getsockname()[1]], ports[b.getsockname()[1]]
    assert rb.connected_addr == LO and rb.connected_port == a.getsockname()[1]
    assert ra.connected_port == 0
    assert ra.sndbuf > 0 and ra.rcvbuf > 0 and ra.inum != rb.inum


def test_info6_sockets(rds_socket_factory):
    s = rds_socket_factory()
    s.bind(("::1", 0))
    recs = s.get_info(InfoType.RDS6_INFO_SOCKETS)
    assert any(
        r.bound_addr == ipaddress.ip_address("::1") and r.bound_port == s.getsockname()[1] for r in recs
    )


def test_info_connections_loop(rds_pair):
    a, b = rds_pair
    a.sendto(b"x", b.getsockname())
    b.recv(10)
    recs = a.get_info(InfoType.RDS_INFO_CONNECTIONS)
    loops = [r for r in recs if r.laddr == LO and r.faddr == LO]
    assert loops, recs
    assert loops[0].transport == "loopback"
    assert loops[0].flags & InfoConnectionFlag.CONNECTED
    assert loops[0].next_tx_seq >= 2


def test_info_recv_queue(rds_pair):
    """A queued, unread message shows in RDS_INFO_RECV_MESSAGES from the receiver's point of view."""
    a, b = rds_pair
    a.sendto(b"queued!", b.getsockname())
    assert wait_readable(b, 5)
    recs = a.get_info(InfoType.RDS_INFO_RECV_MESSAGES)
    mine = [r for r in recs if r.lport == b.getsockname()[1] and r.fport == a.getsockname()[1]]
    assert len(mine) == 1, recs
    assert mine[0].len == 7 and mine[0].laddr == LO and mine[0].faddr == LO
    b.recv(10)
    recs = a.get_info(InfoType.RDS_INFO_RECV_MESSAGES)
    assert not [r for r in recs if r.lport == b.getsockname()[1]]


def test_info_send_and_retrans_queues_readable(rds_pair):
    a, _b = rds_pair
    for t in (
        InfoType.RDS_INFO_SEND_MESSAGES,
        InfoType.RDS_INFO_RETRANS_MESSAGES,
        InfoType.RDS6_INFO_SEND_MESSAGES,
        InfoType.RDS6_INFO_CONNECTIONS,
    ):
        assert isinstance(a.get_info(t), list | tuple)


def test_info_getsockopt_probe_enospc(rds_socket_factory):
    """Raw RDS_INFO via getsockopt: a too-small buffer is ENOSPC (the kernel reports the size needed)."""
    s = rds_socket_factory()
    expect_errno(errno.ENOSPC, s.getsockopt, SOL_RDS, InfoType.RDS_INFO_COUNTERS, 8)


def test_info_bad_type(rds_socket_factory):
    s = rds_socket_factory()
    expect_errno(errno.ENOPROTOOPT, s.getsockopt, SOL_RDS, 10002, 1024)  # RDS_INFO_FLOWS is gone


# ---- ping


def test_ping_gets_pong(rds_pair, rds_observe):
    """A message to port 0 is a ping: the node answers with a 0-byte pong from port 0 to the sender's port."""
    a, _b = rds_pair
    before = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    assert a.sendto(b"", ("127.0.0.1", 0)) == 0
    data, src = a.recvfrom(100)
    assert data == b"" and src == ("127.0.0.1", 0)
    after = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    assert after["recv_ping"] > before["recv_ping"]
    assert after["send_pong"] > before["send_pong"]
    rds_observe("pong", (data, src))


def test_ping_with_payload(rds_pair):
    """The pong is always 0 bytes, whatever the ping carried."""
    a, _b = rds_pair
    a.sendto(b"payload" * 10, ("127.0.0.1", 0))
    assert a.recvfrom(100) == (b"", ("127.0.0.1", 0))


def test_recv_after_close_ebadf(rds_socket_factory):
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    s.close()
    expect_errno(errno.EBADF, s.recv, 10)
    s.close()  # idempotent


def test_close_drops_queue_and_frees_port(rds_socket_factory):
    a, b = rds_socket_factory(), rds_socket_factory()
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    addr = b.getsockname()
    a.sendto(b"lost", addr)
    b.close()
    c = rds_socket_factory()
    deadline = time.monotonic() + 5
    while True:
        try:
            c.bind(addr)
            break
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE and time.monotonic() < deadline
            time.sleep(0.05)
    c.settimeout(0.3)
    try:
        data = c.recv(10)
        raise AssertionError(f"new socket got the old socket's message {data!r}")
    except TimeoutError:
        pass
    _ = socket
