"""Userspace stack over the loop transport: data path, readiness, errno rules (no AF_RDS needed)."""

from __future__ import annotations

import errno
import select
import socket
import struct
import subprocess
import sys

import pytest

import pyrds
from pyrds.constants import SOL_RDS, CmsgType, InfoType, SockOpt, Transport
from pyrds.userspace import RDSSocket

SO_TIMESTAMP = 29  # SO_TIMESTAMP_OLD (the stdlib does not export it)


def _pair() -> tuple[RDSSocket, RDSSocket]:
    a, b = RDSSocket(), RDSSocket()
    a.bind(("127.0.0.1", 4000))
    b.bind(("127.0.0.1", 0))
    return a, b


def _local_v4() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.200", 9))
            ip: str = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_exchange_and_source_address() -> None:
    a, b = _pair()
    port = b.getsockname()[1]
    assert port >= 2
    assert b.sendto(b"hello", ("127.0.0.1", 4000)) == 5
    data, addr = a.recvfrom(100)
    assert data == b"hello" and addr == ("127.0.0.1", port)
    for i in range(50):
        b.sendto(b"%d" % i, ("127.0.0.1", 4000))
    assert [int(a.recv(10)) for _ in range(50)] == list(range(50))
    assert pyrds.socket("userspace").backend == "userspace"


def test_poll_readiness() -> None:
    a, b = _pair()
    assert select.select([a], [], [], 0)[0] == []
    assert select.select([], [a], [], 0)[1] == [a]
    b.sendto(b"x", ("127.0.0.1", 4000))
    assert select.select([a], [], [], 1)[0] == [a]
    a.recv(10)
    assert select.select([a], [], [], 0)[0] == []


def test_errno_rules() -> None:
    s = RDSSocket()
    with pytest.raises(OSError) as ei:
        s.send(b"x")
    assert ei.value.errno == errno.ENOTCONN
    for bad in (("0.0.0.0", 5), ("255.255.255.255", 5), ("224.0.0.1", 5), ("127.0.0.1", 1)):
        with pytest.raises(OSError) as ei:
            s.bind(bad)
        assert ei.value.errno == errno.EINVAL, bad
    with pytest.raises(OSError) as ei:
        s.bind(("192.0.2.77", 5))
    assert ei.value.errno == errno.EADDRNOTAVAIL
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == -1
    s.bind(("127.0.0.1", 4100))
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.LOOP
    with pytest.raises(OSError) as ei:
        s.bind(("127.0.0.1", 4101))
    assert ei.value.errno == errno.EINVAL
    t = RDSSocket()
    with pytest.raises(OSError) as ei:
        t.bind(("127.0.0.1", 4100))
    assert ei.value.errno == errno.EADDRINUSE
    with pytest.raises(OSError) as ei:
        s.sendto(b"x", socket.MSG_OOB, ("127.0.0.1", 4100))
    assert ei.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as ei:
        s.sendto(b"x" * ((1 << 20) + 1), ("127.0.0.1", 4100))
    assert ei.value.errno == errno.EMSGSIZE
    with pytest.raises(OSError) as ei:
        s.connect(("0.0.0.0", 1))
    assert ei.value.errno == errno.EDESTADDRREQ
    s.setblocking(False)
    with pytest.raises(OSError) as ei:
        s.recv(10)
    assert ei.value.errno == errno.EAGAIN
    u = RDSSocket()
    with pytest.raises(OSError) as ei:
        u.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.IB)
    assert ei.value.errno == errno.ENOPROTOOPT
    u.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
    with pytest.raises(OSError) as ei:
        u.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
    assert ei.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as ei:
        RDSSocket(socket.SOCK_DGRAM)
    assert ei.value.errno == errno.ESOCKTNOSUPPORT


def test_buffers_doubled_and_sndbuf_emsgsize() -> None:
    a, b = _pair()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    assert b.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 16384
    with pytest.raises(OSError) as ei:
        b.sendto(b"x" * 8193, ("127.0.0.1", 4000))
    assert ei.value.errno == errno.EMSGSIZE
    assert b.sendto(b"x" * 8192, ("127.0.0.1", 4000)) == 8192


def test_peek_and_trunc() -> None:
    a, b = _pair()
    b.sendto(b"0123456789", ("127.0.0.1", 4000))
    assert a.recv(100, socket.MSG_PEEK) == b"0123456789"
    data, _anc, flags, _addr = a.recvmsg(4)
    assert data == b"0123" and flags & socket.MSG_TRUNC
    a.setblocking(False)
    with pytest.raises(OSError):
        a.recv(100)


def test_info_tables_and_enospc() -> None:
    a, b = _pair()
    b.sendto(b"q" * 7, ("127.0.0.1", 4000))
    socks = a.get_info(InfoType.RDS_INFO_SOCKETS)
    assert {s.bound_port for s in socks} >= {4000}
    recv = a.get_info(InfoType.RDS_INFO_RECV_MESSAGES)
    assert [r.len for r in recv] == [7]
    counters = {c.name: c.value for c in a.get_info(InfoType.RDS_INFO_COUNTERS)}
    assert counters["recv_queued"] >= 1
    with pytest.raises(OSError) as ei:
        a.getsockopt(SOL_RDS, InfoType.RDS_INFO_SOCKETS, 1)
    assert ei.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as ei:
        a.getsockopt(SOL_RDS, InfoType.RDS_INFO_IB_CONNECTIONS, 100)
    assert ei.value.errno == errno.ENOPROTOOPT


def test_ping_pong_over_loop() -> None:
    a, _b = _pair()
    a.sendto(b"", ("127.0.0.1", 0))
    data, addr = a.recvfrom(10)
    assert data == b"" and addr == ("127.0.0.1", 0)


def test_congestion_enobufs_and_cong_update() -> None:
    ip = _local_v4()
    if ip is None:
        pytest.skip("no non-loopback local IPv4 address")
    r, s = RDSSocket(), RDSSocket()
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # rcvbuf 8192 -> congested above 4096 bytes
    r.bind((ip, 4200))
    s.bind((ip, 0))
    s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
    s.setblocking(False)
    sent = 0
    with pytest.raises(OSError) as ei:
        for _ in range(100):
            s.sendto(b"z" * 1000, (ip, 4200))
            sent += 1
    assert ei.value.errno == errno.ENOBUFS
    assert sent == 5
    for _ in range(sent):
        r.recv(2000)
    data, anc, _flags, _addr = s.recvmsg(10, 64)
    assert data == b""
    assert anc and anc[0][:2] == (SOL_RDS, CmsgType.RDS_CMSG_CONG_UPDATE)
    assert struct.unpack("=Q", anc[0][2])[0] == 1 << (4200 % 64)
    assert s.sendto(b"ok", (ip, 4200)) == 2


_CHILD = """
import errno, pyrds
s = pyrds.socket("userspace")
try:
    s.bind(("127.0.0.1", 4300))
except OSError as e:
    print(e.errno)
else:
    print(0)
"""


def test_two_processes_share_one_port_space() -> None:
    a = RDSSocket()
    a.bind(("127.0.0.1", 4300))
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == str(errno.EADDRINUSE), out.stderr


def test_ipv6_loopback_exchange() -> None:
    a, b = RDSSocket(), RDSSocket()
    a.bind(("::1", 4400))
    b.bind(("::1", 0))
    b.sendto(b"six", ("::1", 4400))
    data, addr = a.recvfrom(10)
    assert data == b"six" and addr == ("::1", b.getsockname()[1], 0, 0)
    with pytest.raises(OSError) as ei:
        b.sendto(b"x", ("127.0.0.1", 4400))
    assert ei.value.errno == errno.EOPNOTSUPP


def test_timestamp_and_rxpath_latency_cmsgs() -> None:
    from pyrds import cmsg

    a, b = _pair()
    a.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    a.setsockopt(SOL_RDS, SockOpt.SO_RDS_MSG_RXPATH_LATENCY, cmsg.rx_trace_so([0, 1]))
    b.sendto(b"t", ("127.0.0.1", 4000))
    _data, anc, flags, _addr = a.recvmsg(10, 256)
    kinds = {(lv, t) for lv, t, _ in anc}
    assert (socket.SOL_SOCKET, SO_TIMESTAMP) in kinds
    assert (SOL_RDS, CmsgType.RDS_CMSG_RXPATH_LATENCY) in kinds
    assert not flags & socket.MSG_CTRUNC
    b.sendto(b"t", ("127.0.0.1", 4000))
    _data, anc, flags, _addr = a.recvmsg(10, 0)
    assert anc == [] and flags & socket.MSG_CTRUNC
    with pytest.raises(OSError) as ei:
        a.setsockopt(SOL_RDS, SockOpt.SO_RDS_MSG_RXPATH_LATENCY, bytes([1, 3, 0, 0]))
    assert ei.value.errno == errno.EFAULT


def test_send_cmsg_rules() -> None:
    from pyrds import cmsg

    a, b = _pair()
    dest = ("127.0.0.1", 4000)
    with pytest.raises(OSError) as ei:  # RDMA on a transport without RDMA
        b.sendmsg([b"x"], [cmsg.rdma_args(1, 0, 8, 0, 1)], 0, dest)
    assert ei.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as ei:  # MSG_ZEROCOPY without a cookie
        b.sendmsg([b"x"], [], 0x4000000, dest)
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(OSError) as ei:  # unknown SOL_RDS cmsg
        b.sendmsg([b"x"], [(SOL_RDS, 99, b"\0" * 8)], 0, dest)
    assert ei.value.errno == errno.EINVAL


def test_zerocopy_completion() -> None:
    from pyrds import cmsg

    ip = _local_v4()
    if ip is None:
        pytest.skip("no non-loopback local IPv4 address")
    r, s = RDSSocket(), RDSSocket()
    r.bind((ip, 4500))
    s.bind((ip, 0))
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.TCP
    s.setsockopt(socket.SOL_SOCKET, 60, 1)  # SO_ZEROCOPY
    for cookie in (7, 8):
        s.sendmsg([b"zc"], [cmsg.zcopy_cookie(cookie)], 0x4000000, (ip, 4500))
    s.setblocking(False)
    _d, anc, _f, _a = s.recvmsg(10, 256)
    parsed = cmsg.parse_ancdata(anc)
    assert [list(p.cookies) for p in parsed] == [[7, 8]]
    lo = RDSSocket()
    lo.bind(("127.0.0.1", 0))
    lo.setsockopt(socket.SOL_SOCKET, 60, 1)
    with pytest.raises(OSError) as ei:
        lo.sendmsg([b"zc"], [cmsg.zcopy_cookie(1)], 0x4000000, ("127.0.0.1", 4500))
    assert ei.value.errno == errno.EOPNOTSUPP


def test_tos_and_sysctl() -> None:
    s = RDSSocket()
    with pytest.raises(OSError) as ei:
        s.set_tos(1)
    assert ei.value.errno == errno.ENOTTY
    assert s.get_tos() == 0
    assert s.sysctl_get()["ping_enable"] == 1
    s.sysctl_set("ping_enable", 0)
    a, b = _pair()
    a.sendto(b"", ("127.0.0.1", 0))  # no pong while ping_enable=0: dropped, no socket on port 0
    a.setblocking(False)
    with pytest.raises(OSError) as ei:
        a.recv(10)
    assert ei.value.errno == errno.EAGAIN


_RACER = """
import sys, pyrds
s = pyrds.socket("userspace")
s.bind(("127.0.0.1", int(sys.argv[1])))
print("bound", flush=True)
sys.stdin.readline()
"""


def test_concurrent_first_sockets_start_one_stack() -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(4600 + i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "bound"
        s = RDSSocket()
        ports = {r.bound_port for r in s.get_info(InfoType.RDS_INFO_SOCKETS)}
        assert ports == {4600, 4601, 4602, 4603}
    finally:
        for p in procs:
            p.communicate("\n", timeout=10)


def test_asyncio_add_reader_sees_messages() -> None:
    import asyncio

    a, b = _pair()

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        loop.add_reader(a.fileno(), lambda: fut.done() or fut.set_result(a.recv(100)))
        loop.call_later(0.05, b.sendto, b"async", ("127.0.0.1", 4000))
        try:
            return await asyncio.wait_for(fut, 5)
        finally:
            loop.remove_reader(a.fileno())

    assert asyncio.run(main()) == b"async"
