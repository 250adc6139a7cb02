"""RDS RDMA over rdma_rxe in one guest (both IB sockets on the same IP, transport pinned to IB).

Memory comes from page-aligned mmap-backed ctypes buffers; their addresses go into rds_iovec / cmsgs.
6.1 (rxe registers MRs with FRWR) differs from rds-facts: the RDS_GET_MR / RDS_GET_MR_FOR_DEST socket
options have no connection to post the registration on and fail with EOPNOTSUPP; MRs are made with the
RDS_CMSG_RDMA_MAP control message of a sendmsg (which has the connection), whose cookie travels to the peer
as RDS_CMSG_RDMA_DEST. The FRWR MR is zero-based: remote addresses are offsets into the registered pages.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import struct
from typing import Any

import pytest
from kernel_helpers import errno_of, ib_pair, make_socket, page_buffer, recv_full, tcp_pair

from pyrds import cmsg, uapi
from pyrds.constants import SOL_RDS, InfoType, RdmaFlag, RdmaStatus, SockOpt, Transport
from pyrds.kernel.info import read_info

RW = RdmaFlag.READWRITE
NOTIFY = RdmaFlag.NOTIFY_ME


class Pair:
    def __init__(self, ip: str, socks: list[Any], port: int) -> None:
        self.a, self.b = ib_pair(ip, socks, port)
        self.a_addr, self.b_addr = self.a.getsockname(), self.b.getsockname()
        self.keep: list[Any] = []
        # bring the IB connection up both ways before registering memory on it
        self.a.sendto(b"hello", self.b_addr)
        assert _first_message(self.b) == b"hello"
        self.b.sendto(b"hello", self.a_addr)
        assert _first_message(self.a) == b"hello"

    def buffer(self, size: int = 8192) -> tuple[Any, int]:
        obj, addr = page_buffer(size)
        self.keep.append(obj)
        return obj[1], addr

    def map_on_b(self, addr: int, size: int, flags: int = RW) -> int:
        """B registers [addr, addr+size) with RDS_CMSG_RDMA_MAP and sends the cookie to A."""
        cookie = ctypes.c_uint64(0)
        self.keep.append(cookie)
        self.b.sendmsg([b"map"], [cmsg.rdma_map(addr, size, ctypes.addressof(cookie), flags)], 0, self.a_addr)
        data, anc, _fl, _addr = recv_full(self.a)
        assert data == b"map"
        dests = [x for x in cmsg.parse_ancdata(anc) if isinstance(x, cmsg.RdmaDest)]
        assert cookie.value != 0
        assert dests == [cmsg.RdmaDest(cookie.value)]
        assert dests[0].offset == addr & 4095
        return cookie.value

    def notification(self, sock: Any | None = None) -> cmsg.RdmaNotify:
        data, anc, _fl, _addr = recv_full(sock or self.a, timeout=20)
        assert data == b""
        notes = [x for x in cmsg.parse_ancdata(anc) if isinstance(x, cmsg.RdmaNotify)]
        assert len(notes) == 1, anc
        return notes[0]


def _first_message(sock: Any) -> bytes:
    """The first message over a fresh RDS/IB connection. If it does not come, print what the kernel says about
    the connection (RDS_INFO_CONNECTIONS, RDS_INFO_IB_CONNECTIONS, the kernel log's RDS/rxe lines) before
    failing: 7.3 once left every IB test of a run without its first message, with the host loaded by
    another guest and host test runs (a fresh-clone .ci/run, 2026-11-24); three runs in one boot on an idle
    host passed 21/21."""
    try:
        data: bytes = recv_full(sock, timeout=30)[0]
    except TimeoutError:
        import subprocess

        for table in (InfoType.RDS_INFO_CONNECTIONS, InfoType.RDS_INFO_IB_CONNECTIONS):
            try:
                print(table.name, list(read_info(table)))
            except OSError as exc:
                print(table.name, exc)
        log = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout.splitlines()
        rdma_lines = [line for line in log if "RDS" in line or "rxe" in line or "rdma" in line.lower()]
        print("\n".join(rdma_lines[-40:]))
        raise
    return data


def iov(addr: int, size: int, keep: list[Any]) -> int:
    v = (uapi.rds_iovec * 1)()
    v[0].addr, v[0].bytes = addr, size
    keep.append(v)
    return ctypes.addressof(v)


def test_ib_transport_and_info(rxe_ip: str, sockets: list[Any]) -> None:
    p = Pair(rxe_ip, sockets, 5000)
    assert p.a.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.IB
    conns = [c for c in read_info(InfoType.RDS_INFO_CONNECTIONS) if str(c.faddr) == rxe_ip]
    assert conns and conns[0].transport == "infiniband"
    ib = [c for c in read_info(InfoType.RDS_INFO_IB_CONNECTIONS) if str(c.dst_addr) == rxe_ip]
    assert ib, "no IB connection listed"
    assert str(ib[0].src_addr) == rxe_ip
    assert ib[0].src_gid != bytes(16) and ib[0].max_send_wr > 0 and ib[0].max_recv_wr > 0
    # the v6 IB table lists IPv4 connections too, v4-mapped (rds6_ib_conn_info_visitor skips nothing), as
    # RDS6_INFO_SOCKETS maps IPv4 sockets. Compared as addresses: before 3.13 Python prints a v4-mapped
    # address as "::ffff:a00:1", never "::ffff:10.0.0.1"
    mapped = ipaddress.IPv6Address(f"::ffff:{rxe_ip}")
    ib6 = read_info(InfoType.RDS6_INFO_IB_CONNECTIONS)
    assert any(c.dst_addr == mapped and c.src_addr == mapped for c in ib6), ib6


def test_get_mr_sockopts(rxe_ip: str, tcp_net: dict[str, str], sockets: list[Any]) -> None:
    obj, addr = page_buffer(8192)
    cookie = ctypes.c_uint64(0)
    args = uapi.rds_get_mr_args()
    args.vec.addr, args.vec.bytes, args.cookie_addr, args.flags = addr, 4096, ctypes.addressof(cookie), RW
    raw = uapi.to_bytes(args)
    unbound = make_socket()
    sockets.append(unbound)
    assert errno_of(lambda: unbound.setsockopt(SOL_RDS, SockOpt.RDS_GET_MR, raw)) == errno.ENOTCONN
    t, _ = tcp_pair(tcp_net, sockets, port=5010)
    assert errno_of(lambda: t.setsockopt(SOL_RDS, SockOpt.RDS_GET_MR, raw)) == errno.EOPNOTSUPP
    p = Pair(rxe_ip, sockets, 5020)
    assert errno_of(lambda: p.a.setsockopt(SOL_RDS, SockOpt.RDS_GET_MR, raw)) == errno.EOPNOTSUPP
    dest = uapi.rds_get_mr_for_dest_args()
    dest.dest_addr = uapi.make_sockaddr_storage(rxe_ip, 5021)
    dest.vec.addr, dest.vec.bytes, dest.cookie_addr = addr, 4096, ctypes.addressof(cookie)
    draw = uapi.to_bytes(dest)
    assert errno_of(lambda: p.a.setsockopt(SOL_RDS, SockOpt.RDS_GET_MR_FOR_DEST, draw)) == errno.EOPNOTSUPP
    assert errno_of(lambda: p.a.setsockopt(SOL_RDS, SockOpt.RDS_GET_MR, raw[:16])) == errno.EINVAL
    assert cookie.value == 0
    del obj


def test_free_mr(rxe_ip: str, sockets: list[Any]) -> None:
    p = Pair(rxe_ip, sockets, 5030)
    free = uapi.rds_free_mr_args()
    # cookie 0 flushes the transport's MR pools
    p.b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))
    free.cookie = uapi.rdma_cookie(0x1234, 0)
    assert errno_of(lambda: p.b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))) == errno.EINVAL
    assert errno_of(lambda: p.b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, b"\0" * 8)) == errno.EINVAL
    _buf, addr = p.buffer()
    cookie = p.map_on_b(addr, 4096)
    free.cookie, free.flags = cookie, RdmaFlag.INVALIDATE
    p.b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))
    assert errno_of(lambda: p.b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))) == errno.EINVAL


def test_rdma_write_then_read(rxe_ip: str, sockets: list[Any]) -> None:
    p = Pair(rxe_ip, sockets, 5040)
    bbuf, baddr = p.buffer()
    abuf, aaddr = p.buffer()
    cookie = p.map_on_b(baddr, 4096)
    ctypes.memmove(aaddr, b"W" * 4096, 4096)
    args = cmsg.rdma_args(cookie, 0, 4096, iov(aaddr, 4096, p.keep), 1, RW | NOTIFY, 77)
    assert p.a.sendmsg([b"wrote"], [args], 0, p.b_addr) == 5
    assert recv_full(p.b)[0] == b"wrote"
    assert bbuf.raw[:4096] == b"W" * 4096
    assert p.notification() == cmsg.RdmaNotify(77, RdmaStatus.SUCCESS)
    # RDMA read: B's memory into A's buffer
    ctypes.memmove(baddr, b"R" * 1000, 1000)
    ctypes.memset(aaddr, 0, 4096)
    args = cmsg.rdma_args(cookie, 0, 1000, iov(aaddr, 1000, p.keep), 1, NOTIFY, 78)
    p.a.sendmsg([b"read"], [args], 0, p.b_addr)
    assert recv_full(p.b)[0] == b"read"
    assert p.notification() == cmsg.RdmaNotify(78, RdmaStatus.SUCCESS)
    assert abuf.raw[:1000] == b"R" * 1000 and abuf.raw[1000:1010] == bytes(10)
    # offset into the MR: remote_vec.addr is relative to the registered pages
    ctypes.memmove(aaddr, b"O" * 16, 16)
    args = cmsg.rdma_args(cookie, 100, 16, iov(aaddr, 16, p.keep), 1, RW | NOTIFY, 79)
    p.a.sendmsg([b"off"], [args], 0, p.b_addr)
    assert recv_full(p.b)[0] == b"off"
    assert p.notification().status == RdmaStatus.SUCCESS
    assert bbuf.raw[96:120] == b"R" * 4 + b"O" * 16 + b"R" * 4


def test_rdma_use_once(rxe_ip: str, sockets: list[Any]) -> None:
    p = Pair(rxe_ip, sockets, 5050)
    bbuf, baddr = p.buffer()
    _abuf, aaddr = p.buffer()
    cookie = p.map_on_b(baddr, 4096, RW | RdmaFlag.USE_ONCE | RdmaFlag.INVALIDATE)
    ctypes.memmove(aaddr, b"U" * 64, 64)
    p.a.sendmsg(
        [b"once"], [cmsg.rdma_args(cookie, 0, 64, iov(aaddr, 64, p.keep), 1, RW | NOTIFY, 5)], 0, p.b_addr
    )
    assert recv_full(p.b)[0] == b"once"
    assert bbuf.raw[:64] == b"U" * 64
    assert p.notification().status == RdmaStatus.SUCCESS
    # the receiver's MR was freed when the message carrying the RDMA extension arrived
    free = uapi.rds_free_mr_args()
    free.cookie = cookie
    assert errno_of(lambda: p.b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))) == errno.EINVAL


def test_rdma_cmsg_errnos(rxe_ip: str, sockets: list[Any]) -> None:
    p = Pair(rxe_ip, sockets, 5070)
    _abuf, aaddr = p.buffer()
    cookie = uapi.rdma_cookie(1, 0)
    big = cmsg.rdma_args(cookie, 0, 8, aaddr, 1025, RW)
    assert errno_of(lambda: p.a.sendmsg([b"x"], [big], 0, p.b_addr)) == errno.EMSGSIZE
    short = (SOL_RDS, 1, cmsg.rdma_args(cookie, 0, 8, aaddr, 1)[2][:40])
    assert errno_of(lambda: p.a.sendmsg([b"x"], [short], 0, p.b_addr)) == errno.EINVAL
    two = cmsg.rdma_args(cookie, 0, 8, iov(aaddr, 8, p.keep), 1, RW)
    assert errno_of(lambda: p.a.sendmsg([b"x"], [two, two], 0, p.b_addr)) == errno.EINVAL
    unaligned = cmsg.atomic_fadd(cookie, aaddr + 4, 0, 1)
    assert errno_of(lambda: p.a.sendmsg([b"x"], [unaligned], 0, p.b_addr)) == errno.EFAULT
    bad_iov = cmsg.rdma_args(cookie, 0, 8, 0x10, 1, RW)
    assert errno_of(lambda: p.a.sendmsg([b"x"], [bad_iov], 0, p.b_addr)) == errno.EFAULT


def test_zz_atomics_on_rxe(rxe_ip: str, sockets: list[Any]) -> None:
    """Atomics (FADD, CSWP, masked variants) over rdma_rxe. Runs last: on 6.1 + rxe the first atomic stalls
    the IB connection: sendmsg accepts the message, but neither the message nor an RDMA_STATUS
    notification arrives and the remote word is unchanged (RDS posts IB_WR_MASKED_ATOMIC_* work requests,
    which soft-RoCE does not implement - our reading, not verified in the rxe sources). The builders'
    layout is proven by tests/unit; the kernel accepts all four atomic cmsgs."""
    p = Pair(rxe_ip, sockets, 5060)
    bbuf, baddr = p.buffer()
    _abuf, aaddr = p.buffer()
    ctypes.memmove(baddr, struct.pack("=Q", 100), 8)
    cookie = p.map_on_b(baddr, 4096)

    def remote() -> int:
        return int(struct.unpack_from("=Q", bbuf.raw)[0])

    assert p.a.sendmsg([b"fadd"], [cmsg.atomic_fadd(cookie, aaddr, 0, 5, NOTIFY, 90)], 0, p.b_addr) == 4
    try:
        data = recv_full(p.b, timeout=10)[0]
    except TimeoutError:
        data = None
    if data is not None:  # a kernel/rxe that does atomics: check the full semantics
        assert data == b"fadd"
        assert p.notification() == cmsg.RdmaNotify(90, RdmaStatus.SUCCESS)
        assert (ctypes.c_uint64.from_address(aaddr).value, remote()) == (100, 105)
        pytest.fail("6.1 + rxe completed an atomic: update docs/kernel-vs-facts.md and this test")
    assert remote() == 100
    for anc in (
        cmsg.atomic_cswp(cookie, aaddr, 0, 100, 7, NOTIFY, 91),
        cmsg.masked_atomic_fadd(cookie, aaddr, 0, 0x11, 0xF0, NOTIFY, 92),
        cmsg.masked_atomic_cswp(cookie, aaddr, 0, 100, 7, ~0 & (2**64 - 1), 0xFF, NOTIFY, 93),
    ):
        assert p.a.sendmsg([b"atomic"], [anc], 0, p.b_addr) == 6
