"""RDS/TCP between two network namespaces (veth): kernel/kernel, userspace/userspace and mixed both ways."""

from __future__ import annotations

import errno
import ipaddress
import select
import socket
import time

import pytest

from pyrds import cmsg
from pyrds.cmsg import ZcopyCompletion, parse_ancdata
from pyrds.constants import SOL_RDS, InfoConnectionFlag, InfoType, SockOpt, Transport
from pyrds.info import counters_dict
from pyrds.testing.helpers import drain_nonblocking, sockaddr_in, wait_for, wait_readable
from pyrds.testing.kernelinfo import before_fix_series

MSG_ZEROCOPY = 0x4000000
SO_ZEROCOPY = 60


def _pair(nodes, v6=False):
    a, b = nodes.a.socket(), nodes.b.socket()
    if v6:
        a.bind((nodes.a.addr6, 0))
        b.bind((nodes.b.addr6, 0))
    else:
        a.bind((nodes.a.addr4, 0))
        b.bind((nodes.b.addr4, 0))
    a.settimeout(15)
    b.settimeout(15)
    return a, b


def test_tcp_roundtrip(rds_two_nodes, rds_observe):
    a, b = _pair(rds_two_nodes)
    assert a.sendto(b"A->B", b.getsockname()) == 4
    data, src = b.recvfrom(100)
    assert data == b"A->B" and src == a.getsockname()
    assert b.sendto(b"B->A", a.getsockname()) == 4
    assert a.recvfrom(100) == (b"B->A", b.getsockname())
    assert a.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.TCP
    rds_observe("transport", a.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT))


def test_tcp_roundtrip_ipv6(rds_two_nodes):
    a, b = _pair(rds_two_nodes, v6=True)
    a.sendto(b"v6", b.getsockname())
    data, src = b.recvfrom(100)
    assert data == b"v6" and src[:2] == a.getsockname()[:2] and len(src) == 4
    b.sendto(b"v6back", a.getsockname())
    assert a.recv(100) == b"v6back"


def test_tcp_ordering_and_sizes(rds_two_nodes):
    a, b = _pair(rds_two_nodes)
    sizes = [0, 1, 47, 48, 1000, 4096, 65535, 100000]
    for i, n in enumerate(sizes):
        a.sendto(bytes([i]) * n, b.getsockname())
    for i, n in enumerate(sizes):
        assert b.recv(1 << 20) == bytes([i]) * n


def test_tcp_ping(rds_two_nodes):
    """A ping to port 0 of the peer is answered by an empty pong from port 0. Sent again every 5 s for up to
    60 s, as rds-ping does: on kernels before 7.0 the first message on a fresh RDS/TCP connection can be
    held up for longer than one wait (rds_tcp_accept_one discards; seen once in 15 s on 6.1, 2026-11-23), and
    a known race must not decide the outcome."""
    a, _b = _pair(rds_two_nodes)
    a.settimeout(5)
    for _ in range(12):
        a.sendto(b"", (rds_two_nodes.b.addr4, 0))
        try:
            reply = a.recvfrom(100)
            break
        except TimeoutError:
            continue
    else:
        raise AssertionError("no pong in 60 s (12 pings)")
    assert reply == (b"", (rds_two_nodes.b.addr4, 0))


def test_tcp_connection_info(rds_two_nodes):
    a, b = _pair(rds_two_nodes)
    a.sendto(b"x", b.getsockname())
    b.recv(10)
    la, fb = ipaddress.ip_address(rds_two_nodes.a.addr4), ipaddress.ip_address(rds_two_nodes.b.addr4)
    recs = [r for r in a.get_info(InfoType.RDS_INFO_CONNECTIONS) if r.laddr == la and r.faddr == fb]
    assert len(recs) == 1, recs
    assert recs[0].transport == "tcp" and recs[0].flags & InfoConnectionFlag.CONNECTED


def _tcp_paths(sock, laddr, faddr):
    la, fa = ipaddress.ip_address(laddr), ipaddress.ip_address(faddr)
    return [
        r for r in sock.get_info(InfoType.RDS_INFO_TCP_SOCKETS) if r.local_addr == la and r.peer_addr == fa
    ]


def test_multipath_npaths(rds_two_nodes, rds_observe):
    """The handshake probe negotiates NPATHS=8; the smaller address (node A) then connects all 8 TCP paths.
    Except a userspace node accepting a 6.1 kernel's dials: it answers NPATHS=1 (a 6.1 dialer's paths cannot
    be told apart, so a reset would cross their sequence spaces), and one path is used."""
    a, b = _pair(rds_two_nodes)
    na, nb = rds_two_nodes.a, rds_two_nodes.b
    # a pre-7.0 kernel dialer sends no RDS_EXTHDR_SPORT_IDX: the userspace acceptor answers it NPATHS=1;
    # a 7.x dialer names its paths in the source port and gets 8
    old_dialer = (na.backend, nb.backend) == ("kernel", "userspace") and before_fix_series()
    want = 1 if old_dialer else 8
    # a socket that hashes to a path other than 0 triggers the probe on a kernel dialer
    a.sendto(b"hs", b.getsockname())
    b.recv(10)
    assert wait_for(lambda: len(_tcp_paths(a, na.addr4, nb.addr4)) == want, 10), _tcp_paths(
        a, na.addr4, nb.addr4
    )
    time.sleep(0.5 if want == 1 else 0)
    paths = _tcp_paths(a, na.addr4, nb.addr4)
    assert {p.peer_port for p in paths} == {16385}
    rds_observe("npaths", len(paths))
    assert len({p.local_port for p in paths}) == want


def test_congestion_over_tcp(rds_two_nodes, rds_observe):
    """The receiver's congestion map travels over TCP: the sender eventually gets ENOBUFS, then recovers."""
    na, nb = rds_two_nodes.a, rds_two_nodes.b
    b = nb.socket()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    b.bind((nb.addr4, 0))
    a = na.socket()
    a.bind((na.addr4, 0))
    err, sent = None, 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            a.sendto(b"c" * 1000, socket.MSG_DONTWAIT, b.getsockname())
            sent += 1
        except OSError as exc:
            err = exc.errno
            if err == errno.ENOBUFS:
                break
            assert err == errno.EAGAIN
            time.sleep(0.01)
    assert err == errno.ENOBUFS, f"no ENOBUFS after {sent} messages"
    got = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got += len(drain_nonblocking(b))
        try:
            a.sendto(b"again", socket.MSG_DONTWAIT, b.getsockname())
            break
        except OSError as exc:
            assert exc.errno in (errno.ENOBUFS, errno.EAGAIN)
            time.sleep(0.02)
    else:
        raise AssertionError("sender still congested after the receiver drained")
    rds_observe("congested", True)


def test_reconnect_retransmit(rds_two_nodes):
    """Messages queued while the TCP connections are reset are retransmitted and delivered exactly once,
    in order."""
    na, nb = rds_two_nodes.a, rds_two_nodes.b
    a, b = _pair(rds_two_nodes)
    a.sendto(b"warmup", b.getsockname())
    assert b.recv(100) == b"warmup"
    before = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    for i in range(300):
        a.sendto(i.to_bytes(4, "big") * 25, b.getsockname())
        if i in (100, 200):
            na.force_reconnect()
            nb.force_reconnect()
    got = [b.recv(1 << 16) for _ in range(300)]
    assert got == [i.to_bytes(4, "big") * 25 for i in range(300)]  # 30 KB: below rcvbuf/2
    b.settimeout(1)
    try:
        extra = b.recv(100)
        raise AssertionError(f"duplicate delivered: {extra[:8]!r}")
    except TimeoutError:
        pass
    after = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    assert after["conn_reset"] > before["conn_reset"]


def test_zerocopy_cookie_completion(rds_two_nodes, rds_observe):
    """MSG_ZEROCOPY + RDS_CMSG_ZCOPY_COOKIE on TCP: data arrives, the sender gets
    RDS_CMSG_ZCOPY_COMPLETION."""
    a, b = _pair(rds_two_nodes)
    a.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    assert a.sendmsg([b"z" * 5000], [cmsg.zcopy_cookie(42)], MSG_ZEROCOPY, b.getsockname()) == 5000
    assert b.recv(10000) == b"z" * 5000
    assert wait_readable(a, 10), "no POLLIN for the zerocopy completion"
    data, anc, _flags, _addr = a.recvmsg(100, 256, socket.MSG_DONTWAIT)
    assert data == b""
    done = [p for p in parse_ancdata(anc) if isinstance(p, ZcopyCompletion)]
    assert done and done[0].cookies == (42,), anc
    rds_observe("zcopy", done[0].cookies)


def test_zerocopy_cookie_without_flag_einval(rds_two_nodes):
    a, b = _pair(rds_two_nodes)
    try:
        a.sendmsg([b"z"], [cmsg.zcopy_cookie(1)], 0, b.getsockname())
        raise AssertionError("cookie without MSG_ZEROCOPY accepted")
    except OSError as exc:
        assert exc.errno == errno.EINVAL


def test_rdma_and_atomic_on_tcp_eopnotsupp(rds_two_nodes, rds_observe):
    na = rds_two_nodes.a
    a, b = _pair(rds_two_nodes)
    res = {}
    for kind in ("rdma", "atomic"):
        jid = na.agent.job("pyrds.testing.workloads:rdma_probe", [a], dest=b.getsockname(), kind=kind)
        res[kind] = na.agent.wait(jid, 30)
    rds_observe("rdma", res)
    assert res == {"rdma": errno.EOPNOTSUPP, "atomic": errno.EOPNOTSUPP}


def test_cancel_sent_to_keeps_order(rds_two_nodes):
    """RDS_CANCEL_SENT_TO drops what is still queued to that destination; what arrives is an in-order
    prefix."""
    a, b = _pair(rds_two_nodes)
    host, port = b.getsockname()
    for i in range(50):
        a.sendto(i.to_bytes(2, "big"), b.getsockname())
    a.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr_in(host, port))
    a.sendto(b"marker", b.getsockname())
    got = []
    while True:
        m = b.recv(100)
        if m == b"marker":
            break
        got.append(int.from_bytes(m, "big"))
    assert got == list(range(len(got)))


def test_poll_pollout_tcp(rds_two_nodes):
    a, _b = _pair(rds_two_nodes)
    assert a.poll(select.POLLOUT, 1000) & select.POLLOUT


@pytest.mark.parametrize("side", ["owner", "acceptor"])
def test_one_path_lost_reconnects_alone(rds_two_nodes, rds_observe, side):
    """One TCP path is destroyed (``ss -K``, an RST to the other end) on the dialling node A (the smaller
    address) or on node B: that path is dialled again, and every other path keeps its TCP connection, as
    6.1, 6.12 and 7.3 do (each ``rds_conn_path`` shuts down and reconnects on its own). Messages from
    sockets on every path still arrive, once each. A userspace owner whose peer does not name its paths by
    source port (a 6.1 or 6.12 acceptor) instead closes every path and dials them again in order
    (pyrds.userspace.proto.pathset)."""
    na, nb = rds_two_nodes.a, rds_two_nodes.b
    old_dialer = (na.backend, nb.backend) == ("kernel", "userspace") and before_fix_series()
    want = 1 if old_dialer else 8
    a, b = _pair(rds_two_nodes)
    senders = [a] + [na.socket() for _ in range(15)]
    for s in senders[1:]:
        s.bind((na.addr4, 0))
    dst = b.getsockname()

    def a_ports() -> set[int]:
        """The local ports of A's TCP paths to B."""
        return {p.local_port for p in _tcp_paths(a, na.addr4, nb.addr4)}

    def round_trip(tag: bytes) -> None:
        for i, s in enumerate(senders):
            s.sendto(tag + bytes([i]), dst)
        want_msgs = sorted(tag + bytes([i]) for i in range(len(senders)))
        got: list[bytes] = []
        try:
            while len(got) < len(senders):
                got.append(b.recv(100))  # 15 s each at most (_pair)
        except TimeoutError:
            pass
        missing = sorted(set(want_msgs) - set(got))
        assert sorted(got) == want_msgs, (
            f"{tag!r}: missing {missing}, got {sorted(got)}; A's ports {a_ports()}"
        )

    # One message first, then every path up on both nodes before more: 6.1 and 6.12 can lose the first
    # messages sent on several paths while the dialer fans out (seen here: 4 of 16 not there after 15 s,
    # kernel<->kernel 6.1; kernels.md, the accept path that discards): not what this scenario is about.
    a.sendto(b"hs", dst)
    assert b.recv(10) == b"hs"

    def all_up() -> bool:
        return len(a_ports()) == want and len(_tcp_paths(b, nb.addr4, na.addr4)) == want

    assert wait_for(all_up, 20), (_tcp_paths(a, na.addr4, nb.addr4), _tcp_paths(b, nb.addr4, na.addr4))
    time.sleep(0.5)
    round_trip(b"up")
    before = a_ports()
    assert len(before) == want
    # a path other than 0: a 7.x or pyrds dialer names path i by port % 8 == i (6.1's ports are random)
    victim = next((p for p in sorted(before) if p % 8 == 3), max(before))
    if side == "owner":
        out = na.sh("ss", "-K", "-t", "-n", f"sport = :{victim}").stdout
    else:
        out = nb.sh("ss", "-K", "-t", "-n", f"dport = :{victim}").stdout
    assert f":{victim}" in out, f"ss -K destroyed nothing: {out!r}"

    def restored() -> bool:
        now = a_ports()
        return len(now) == want and victim not in now

    assert wait_for(restored, 30), a_ports()
    after = a_ports()
    rds_observe("other_paths_kept", before - {victim} <= after)
    round_trip(b"after")
    b.settimeout(0.5)
    with pytest.raises(TimeoutError):
        extra = b.recv(100)
        raise AssertionError(f"delivered twice: {extra!r}")
