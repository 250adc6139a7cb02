"""RDMA on userspace RDS/IB sockets (issue 9, part 4): two stacks on the fake verbs fabric, the clients'
memory this test process's own (ctypes buffers, reached with process_vm_readv/writev as the service reaches a
client's), checked against what the kernel does (tests/kernel/test_rdma.py, net/rds/rdma.c)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Any

import pytest
from test_ib_transport import A, B, Pair, ib_socket, ip

from pyrds import cmsg, uapi
from pyrds.constants import SOL_RDS, ExtHeaderType, RdmaFlag, RdmaStatus, SockOpt
from pyrds.userspace.proto.header import RDSHeader
from pyrds.userspace.stack import rdma
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.memory import ClientMemory, own_memory
from pyrds.userspace.stack.sockopts import setsockopt
from pyrds.userspace.stack.sockstate import SockState

RW = RdmaFlag.READWRITE
NOTIFY = RdmaFlag.NOTIFY_ME


def page_buffer(keep: list[Any], size: int = 8192) -> int:
    """A page-aligned buffer of ``size`` bytes in this process; its address."""
    raw = ctypes.create_string_buffer(size + 4096)
    keep.append(raw)
    return (ctypes.addressof(raw) + 4095) & ~4095


def iov(keep: list[Any], *vecs: tuple[int, int]) -> int:
    arr = (uapi.rds_iovec * len(vecs))()
    for i, (addr, n) in enumerate(vecs):
        arr[i].addr, arr[i].bytes = addr, n
    keep.append(arr)
    return ctypes.addressof(arr)


def errno_of(fn: Any) -> int:
    with pytest.raises(StackError) as ei:
        fn()
    return ei.value.code


class Rdma:
    """A (port 4000 on A) and B (port 5000 on B), their IB connection up."""

    def __init__(self) -> None:
        self.p = Pair()
        self.keep: list[Any] = []
        self.sa = ib_socket(self.p.a, A, 4000)
        self.sb = ib_socket(self.p.b, B, 5000)
        self.send(self.sa, b"hello")
        assert self.recv(self.sb)[0] == b"hello"

    def send(self, rs: SockState, data: bytes, anc: list[Any] | None = None) -> int:
        stack, dest = (self.p.a, (ip(B), 5000)) if rs is self.sa else (self.p.b, (ip(A), 4000))
        n = stack.sendmsg(rs, data, anc or [], 0, dest, True)
        self.p.loop.run()
        return n

    def recv(self, rs: SockState, anc: int = 256) -> tuple[bytes, list[Any]]:
        stack = self.p.a if rs is self.sa else self.p.b
        data, items, _flags, _addr = stack.recvmsg(rs, 1 << 20, anc, 0, True)
        return data, cmsg.parse_ancdata(items)

    def map_on_b(self, addr: int, size: int, flags: int = RW) -> int:
        cookie = ctypes.c_uint64(0)
        self.keep.append(cookie)
        self.send(self.sb, b"map", [cmsg.rdma_map(addr, size, ctypes.addressof(cookie), flags)])
        data, anc = self.recv(self.sa)
        assert data == b"map"
        assert cookie.value != 0
        assert anc == [cmsg.RdmaDest(cookie.value)]
        assert cookie.value >> 32 == addr & 4095
        return cookie.value

    def notification(self) -> list[Any]:
        data, anc = self.recv(self.sa)
        assert data == b""
        return anc


def test_map_write_then_read_with_notifications() -> None:
    r = Rdma()
    baddr = page_buffer(r.keep)
    aaddr = page_buffer(r.keep)
    cookie = r.map_on_b(baddr, 4096)
    assert uapi.rdma_cookie_key(cookie) in r.sb.mrs
    ctypes.memmove(aaddr, b"W" * 4096, 4096)
    args = cmsg.rdma_args(cookie, 0, 4096, iov(r.keep, (aaddr, 4096)), 1, RW | NOTIFY, 77)
    assert r.send(r.sa, b"wrote", [args]) == 5
    data, anc = r.recv(r.sb)
    assert data == b"wrote" and anc == []
    assert ctypes.string_at(baddr, 4096) == b"W" * 4096  # visible when the message is delivered
    assert r.notification() == [cmsg.RdmaNotify(77, RdmaStatus.SUCCESS)]
    assert r.p.a.counters["send_rdma"] == 1 and r.p.a.counters["send_rdma_bytes"] == 4096
    # B changes its buffer and names the MR again (RDMA_DEST: the kernel's sync_mr to the device); A reads
    ctypes.memmove(baddr, b"R" * 1000, 1000)
    r.send(r.sb, b"again", [cmsg.rdma_dest(cookie)])
    assert r.recv(r.sa) == (b"again", [cmsg.RdmaDest(cookie)])
    ctypes.memset(aaddr, 0, 4096)
    r.send(r.sa, b"read", [cmsg.rdma_args(cookie, 0, 1000, iov(r.keep, (aaddr, 1000)), 1, NOTIFY, 78)])
    assert r.recv(r.sb)[0] == b"read"
    assert r.notification() == [cmsg.RdmaNotify(78, RdmaStatus.SUCCESS)]
    assert ctypes.string_at(aaddr, 1010) == b"R" * 1000 + bytes(10)
    assert r.p.a.counters["recv_rdma_bytes"] == 1000  # the kernel counts a READ's bytes as received
    # an offset into the MR (zero-based: relative to the registered page), two local vectors
    ctypes.memmove(aaddr, b"O" * 8, 8)
    ctypes.memmove(aaddr + 2048, b"P" * 8, 8)
    args = cmsg.rdma_args(cookie, 100, 16, iov(r.keep, (aaddr, 8), (aaddr + 2048, 8)), 2, RW)
    r.send(r.sa, b"off", [args])
    assert r.recv(r.sb)[0] == b"off"
    assert ctypes.string_at(baddr + 96, 24) == b"R" * 4 + b"O" * 8 + b"P" * 8 + b"R" * 4
    assert r.p.a.recvmsg(r.sa, 100, 100, 0, True) if r.sa.rdma_notify else True  # no NOTIFY_ME: nothing
    assert not r.sa.rdma_notify


def test_unaligned_map_cookie_offset_and_only_the_peers_bytes_go_back() -> None:
    r = Rdma()
    base = page_buffer(r.keep)
    ctypes.memmove(base, b"a" * 8192, 8192)
    cookie = r.map_on_b(base + 100, 200)  # one page registered, the cookie's offset 100
    assert cookie >> 32 == 100
    mr = r.sb.mrs[uapi.rdma_cookie_key(cookie)]
    assert (mr.base, mr.length) == (base, 4096)
    aaddr = page_buffer(r.keep)
    ctypes.memmove(aaddr, b"x" * 10, 10)
    # B's client writes elsewhere in the same page after the map: the write-back keeps it
    ctypes.memmove(base + 3000, b"mine", 4)
    r.send(r.sa, b"w", [cmsg.rdma_args(cookie, 5, 10, iov(r.keep, (aaddr, 10)), 1, RW)])
    assert r.recv(r.sb)[0] == b"w"
    assert ctypes.string_at(base + 100, 20) == b"aaaaa" + b"x" * 10 + b"aaaaa"
    assert ctypes.string_at(base + 3000, 4) == b"mine"


def test_the_rdma_wr_goes_before_the_message_with_both_extension_headers() -> None:
    r = Rdma()
    baddr = page_buffer(r.keep)
    aaddr = page_buffer(r.keep)
    cookie = r.map_on_b(baddr, 4096)
    qp = next(q for q in r.p.fabric.qps if q.src == A and not q.closed)
    qp.sent.clear()
    # an RDMA_ARGS and, in the same message, no MAP/DEST (the kernel refuses the mix): RDS_EXTHDR_RDMA only
    r.send(r.sa, b"x", [cmsg.rdma_args(cookie, 0, 8, iov(r.keep, (aaddr, 8)), 1, RW)])
    rdma_wr = qp.rdma_posted[-1]
    first_send = next(s for s in qp.sent if s[2][48:] == b"x")
    assert rdma_wr[0] < first_send[1]  # posted first: the data is there when the message is delivered
    assert rdma_wr[1:] == (True, 8, uapi.rdma_cookie_key(cookie), 0)
    h = RDSHeader.decode(first_send[2][:48])
    assert [(e.type, e.body) for e in h.exthdr] == [
        (ExtHeaderType.RDMA, struct.pack(">I", uapi.rdma_cookie_key(cookie)))
    ]
    # a message with RDMA_DEST carries RDS_EXTHDR_RDMA_DEST (r_key, offset)
    qpb = next(q for q in r.p.fabric.qps if q.src == B and not q.closed)
    qpb.sent.clear()
    r.send(r.sb, b"d", [cmsg.rdma_dest(cookie)])
    h = RDSHeader.decode(next(s for s in qpb.sent if s[2][48:] == b"d")[2][:48])
    body = struct.pack(">II", uapi.rdma_cookie_key(cookie), cookie >> 32)
    assert [(e.type, e.body) for e in h.exthdr] == [(ExtHeaderType.RDMA_DEST, body)]


def test_use_once_and_free_mr() -> None:
    r = Rdma()
    baddr = page_buffer(r.keep)
    aaddr = page_buffer(r.keep)
    free = uapi.rds_free_mr_args()
    # cookie 0 flushes the transport's MRs: fine on IB; an unknown cookie, a short option: EINVAL
    setsockopt(r.p.b, r.sb, SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))
    free.cookie = uapi.rdma_cookie(0x1234, 0)
    assert errno_of(lambda: setsockopt(r.p.b, r.sb, SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))) == 22
    assert errno_of(lambda: setsockopt(r.p.b, r.sb, SOL_RDS, SockOpt.RDS_FREE_MR, b"\0" * 8)) == errno.EINVAL
    cookie = r.map_on_b(baddr, 4096, RW | RdmaFlag.USE_ONCE | RdmaFlag.INVALIDATE)
    ctypes.memmove(aaddr, b"U" * 64, 64)
    r.send(r.sa, b"once", [cmsg.rdma_args(cookie, 0, 64, iov(r.keep, (aaddr, 64)), 1, RW | NOTIFY, 5)])
    assert r.recv(r.sb)[0] == b"once"
    assert ctypes.string_at(baddr, 64) == b"U" * 64
    assert r.notification() == [cmsg.RdmaNotify(5, RdmaStatus.SUCCESS)]
    # freed when the message carrying RDS_EXTHDR_RDMA arrived
    free.cookie = cookie
    assert errno_of(lambda: setsockopt(r.p.b, r.sb, SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))) == 22
    # a plain MR: freed by RDS_FREE_MR once, then unknown; its registration is gone
    cookie = r.map_on_b(baddr, 4096)
    qpb = next(q for q in r.p.fabric.qps if q.src == B and not q.closed)
    assert uapi.rdma_cookie_key(cookie) in qpb.regions
    free.cookie, free.flags = cookie, RdmaFlag.INVALIDATE
    setsockopt(r.p.b, r.sb, SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))
    assert uapi.rdma_cookie_key(cookie) not in qpb.regions
    assert errno_of(lambda: setsockopt(r.p.b, r.sb, SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free))) == 22
    # close drops the socket's MRs (rds_rdma_drop_keys)
    cookie = r.map_on_b(baddr, 4096)
    r.p.b.close(r.sb)
    assert uapi.rdma_cookie_key(cookie) not in qpb.regions


def test_a_bad_r_key_is_a_remote_error_notification() -> None:
    r = Rdma()
    aaddr = page_buffer(r.keep)
    bogus = uapi.rdma_cookie(0xBAD, 0)
    r.send(r.sa, b"x", [cmsg.rdma_args(bogus, 0, 8, iov(r.keep, (aaddr, 8)), 1, RW | NOTIFY, 9)])
    assert r.notification() == [cmsg.RdmaNotify(9, RdmaStatus.REMOTE_ERROR)]


def test_get_mr_sockopts_as_the_kernel_with_an_frwr_device() -> None:
    r = Rdma()
    addr = page_buffer(r.keep)
    cookie = ctypes.c_uint64(0)
    args = uapi.rds_get_mr_args()
    args.vec.addr, args.vec.bytes, args.cookie_addr, args.flags = addr, 4096, ctypes.addressof(cookie), RW
    raw = uapi.to_bytes(args)
    unbound = r.p.a.open()
    assert errno_of(lambda: setsockopt(r.p.a, unbound, SOL_RDS, SockOpt.RDS_GET_MR, raw)) == errno.ENOTCONN
    assert errno_of(lambda: setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_GET_MR, raw)) == errno.EOPNOTSUPP
    assert errno_of(lambda: setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_GET_MR, raw[:16])) == errno.EINVAL
    dest = uapi.rds_get_mr_for_dest_args()
    dest.dest_addr = uapi.make_sockaddr_storage(B, 5000)
    dest.vec.addr, dest.vec.bytes, dest.cookie_addr = addr, 4096, ctypes.addressof(cookie)
    draw = uapi.to_bytes(dest)
    assert errno_of(lambda: setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_GET_MR_FOR_DEST, draw)) == 95
    # __rds_rdma_map's own checks come first: nothing to map, too much, memory that is not there
    args.vec.bytes = 0
    assert errno_of(lambda: setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_GET_MR, uapi.to_bytes(args))) == 22
    args.vec.bytes = (1 << 20) + 8192
    assert errno_of(lambda: setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_GET_MR, uapi.to_bytes(args))) == 90
    args.vec.addr, args.vec.bytes = 0x1000, 16
    assert errno_of(lambda: setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_GET_MR, uapi.to_bytes(args))) == 14
    assert cookie.value == 0


def test_rdma_cmsg_errnos() -> None:
    r = Rdma()
    aaddr = page_buffer(r.keep)
    cookie = uapi.rdma_cookie(1, 0)

    def send(anc: list[Any]) -> int:
        return errno_of(lambda: r.p.a.sendmsg(r.sa, b"x", anc, 0, (ip(B), 5000), True))

    assert send([cmsg.rdma_args(cookie, 0, 8, aaddr, 1025, RW)]) == errno.EMSGSIZE
    assert send([cmsg.rdma_args(cookie, 0, 8, aaddr, 0, RW)]) == errno.EINVAL
    assert send([(SOL_RDS, 1, cmsg.rdma_args(cookie, 0, 8, aaddr, 1)[2][:40])]) == errno.EINVAL
    two = cmsg.rdma_args(cookie, 0, 8, iov(r.keep, (aaddr, 8)), 1, RW)
    assert send([two, two]) == errno.EINVAL
    assert send([cmsg.atomic_fadd(cookie, aaddr + 4, 0, 1)]) == errno.EFAULT  # unaligned local word
    assert send([cmsg.rdma_args(cookie, 0, 8, 0x10, 1, RW)]) == errno.EFAULT  # the iovec array is not there
    assert send([cmsg.rdma_args(cookie, 0, 8, iov(r.keep, (0x1000, 8)), 1, RW)]) == errno.EFAULT
    assert send([cmsg.rdma_args(cookie, 0, 8, iov(r.keep, (aaddr, 0)), 1, RW)]) == errno.EINVAL
    assert send([cmsg.rdma_args(cookie, 0, 4, iov(r.keep, (aaddr, 8)), 1, RW)]) == errno.EINVAL  # > remote
    assert send([cmsg.rdma_dest(cookie)]) == errno.EINVAL  # no MR with that r_key on this socket
    assert send([cmsg.rdma_map(aaddr, 8, 0), two]) == errno.EINVAL  # (MAP, DEST) never with (ARGS, atomics)
    assert send([cmsg.rdma_map(aaddr, 8, 0), cmsg.rdma_map(aaddr, 8, 0)]) == errno.EINVAL
    assert send([cmsg.rdma_map(aaddr, 0, 0)]) == errno.EINVAL
    # a cookie address that is not there: EFAULT, and the MR made for it is gone again
    assert send([cmsg.rdma_map(aaddr, 8, 0x1000)]) == errno.EFAULT
    assert r.sa.mrs == {}
    assert not any(q.regions for q in r.p.fabric.qps if q.src == A and not q.closed)
    # atomics: short EINVAL, two EINVAL, with an RDMA_ARGS EOPNOTSUPP (the kernel posts both; one op per
    # message here), masks other than the plain op's EOPNOTSUPP (no masked atomics in verbs or rxe)
    fadd = cmsg.atomic_fadd(cookie, aaddr, 0, 1)
    assert send([(SOL_RDS, fadd[1], fadd[2][:64])]) == errno.EINVAL
    assert send([fadd, fadd]) == errno.EINVAL
    assert send([fadd, two]) == errno.EOPNOTSUPP and send([two, fadd]) == errno.EOPNOTSUPP
    assert send([cmsg.masked_atomic_fadd(cookie, aaddr, 0, 1, 0xFF)]) == errno.EOPNOTSUPP
    assert send([cmsg.masked_atomic_cswp(cookie, aaddr, 0, 1, 2, (1 << 64) - 1, 0xFF)]) == errno.EOPNOTSUPP
    assert send([cmsg.masked_atomic_fadd(cookie, 0x1000, 0, 1, 0xFF)]) == errno.EFAULT  # the word first
    assert r.sa.snd_bytes == 0  # nothing was queued by any of these


def test_atomics_fetch_add_and_compare_swap_into_a_peer_mr() -> None:
    """Plain FADD and CSWP (and the masked types with the plain masks) on a word of B's MR: the original
    value lands in A's local word, the RDMA_STATUS is SUCCESS, the counters are the kernel's, and B's client
    sees the new value when the message arrives (it carries RDS_EXTHDR_RDMA, as an RDMA op's does)."""
    r = Rdma()
    baddr = page_buffer(r.keep)
    aaddr = page_buffer(r.keep)
    ctypes.memmove(baddr + 64, (41).to_bytes(8, "little"), 8)
    cookie = r.map_on_b(baddr, 4096)
    r.send(r.sa, b"fadd", [cmsg.atomic_fadd(cookie, aaddr, 64, 1, NOTIFY, 90)])
    assert r.recv(r.sb)[0] == b"fadd"
    assert int.from_bytes(ctypes.string_at(baddr + 64, 8), "little") == 42
    assert int.from_bytes(ctypes.string_at(aaddr, 8), "little") == 41  # the original value
    assert r.notification() == [cmsg.RdmaNotify(90, RdmaStatus.SUCCESS)]
    # compare-and-swap: a miss leaves the word, a hit swaps it; both return the original
    r.send(r.sa, b"miss", [cmsg.atomic_cswp(cookie, aaddr + 8, 64, 7, 1000, NOTIFY, 91)])
    assert r.recv(r.sb)[0] == b"miss"
    assert int.from_bytes(ctypes.string_at(baddr + 64, 8), "little") == 42
    assert int.from_bytes(ctypes.string_at(aaddr + 8, 8), "little") == 42
    assert r.notification() == [cmsg.RdmaNotify(91, RdmaStatus.SUCCESS)]
    ones = (1 << 64) - 1
    r.send(r.sa, b"hit", [cmsg.masked_atomic_cswp(cookie, aaddr + 16, 64, 42, 1000, ones, ones)])
    assert r.recv(r.sb)[0] == b"hit"
    assert int.from_bytes(ctypes.string_at(baddr + 64, 8), "little") == 1000
    assert int.from_bytes(ctypes.string_at(aaddr + 16, 8), "little") == 42
    r.send(r.sa, b"wrap", [cmsg.masked_atomic_fadd(cookie, aaddr + 24, 64, ones, 0)])  # + (2^64 - 1)
    assert r.recv(r.sb)[0] == b"wrap"
    assert int.from_bytes(ctypes.string_at(baddr + 64, 8), "little") == 999
    ib_counters = r.p.ib_a.stat_counters()
    assert (ib_counters["ib_atomic_fadd"], ib_counters["ib_atomic_cswp"]) == (2, 2)
    assert r.p.a.counters["send_rdma_bytes"] == r.p.a.counters["recv_rdma_bytes"] == 0
    assert [w[1] for w in next(q for q in r.p.fabric.qps if q.src == A and not q.closed).rdma_posted] == [
        "fadd", "cswp", "cswp", "fadd"
    ]


def test_an_atomic_on_an_unaligned_or_unknown_remote_word_is_a_remote_error() -> None:
    r = Rdma()
    baddr = page_buffer(r.keep)
    aaddr = page_buffer(r.keep)
    cookie = r.map_on_b(baddr, 4096)
    ctypes.memmove(aaddr, b"\xaa" * 8, 8)
    r.send(r.sa, b"odd", [cmsg.atomic_fadd(cookie, aaddr, 4, 1, NOTIFY, 92)])
    assert r.notification() == [cmsg.RdmaNotify(92, RdmaStatus.REMOTE_ERROR)]
    assert ctypes.string_at(aaddr, 8) == b"\xaa" * 8  # nothing written back on an error
    # the connection dropped (both QPs in error) and comes back: a message each way
    r.send(r.sa, b"after")
    assert r.recv(r.sb)[0] == b"after"
    r.send(r.sb, b"retfa")
    assert r.recv(r.sa)[0] == b"retfa"


def test_map_before_the_connection_is_up_is_eagain_and_dials() -> None:
    p = Pair()
    keep: list[Any] = []
    sa = ib_socket(p.a, A, 4000)
    ib_socket(p.b, B, 5000)
    addr = page_buffer(keep)
    anc = [cmsg.rdma_map(addr, 64, 0)]
    assert errno_of(lambda: p.a.sendmsg(sa, b"m", anc, 0, (ip(B), 5000), True)) == errno.EAGAIN
    p.loop.run()
    assert p.a.sendmsg(sa, b"m", anc, 0, (ip(B), 5000), True) == 1
    assert len(sa.mrs) == 1


def test_notifications_come_first_and_fill_the_control_buffer() -> None:
    r = Rdma()
    baddr = page_buffer(r.keep)
    aaddr = page_buffer(r.keep)
    cookie = r.map_on_b(baddr, 4096)
    for token in (1, 2, 3):
        r.send(r.sa, b"n", [cmsg.rdma_args(cookie, 0, 8, iov(r.keep, (aaddr, 8)), 1, RW | NOTIFY, token)])
    r.send(r.sb, b"data for A")
    space = ctypes.sizeof(uapi.rds_rdma_notify) + 16  # CMSG_SPACE(16)
    assert r.recv(r.sa, 2 * space) == (b"", [cmsg.RdmaNotify(1, 0), cmsg.RdmaNotify(2, 0)])
    # too small a buffer: one is consumed anyway, truncated (MSG_CTRUNC), as rds_notify_queue_get does
    data, items, flags, _ = r.p.a.recvmsg(r.sa, 100, 0, 0, True)
    assert (data, items, flags & 0x8) == (b"", [], 0x8)
    assert r.recv(r.sa)[0] == b"data for A"


def test_client_memory_is_bounded_and_faults_are_efault() -> None:
    keep: list[Any] = []
    addr = page_buffer(keep)
    mem = own_memory()
    mem.write(addr, b"abc")
    assert mem.read(addr, 3) == b"abc"
    for bad in (
        lambda: mem.read(0x1000, 8),
        lambda: mem.write(0x1000, b"x"),
        lambda: mem.read(addr, 1 << 30),
    ):
        assert errno_of(bad) == errno.EFAULT
    assert errno_of(lambda: mem.read((1 << 64) - 4, 8)) == errno.EFAULT
    # the pid is re-checked against the peer's uid: a recycled pid of another user is never read
    other = ClientMemory(os.getpid(), uid=os.getuid() + 12345)
    assert errno_of(lambda: other.read(addr, 3)) == errno.EFAULT
    assert errno_of(lambda: ClientMemory(2**22 + 7, uid=0).read(addr, 3)) == errno.EFAULT


def test_changed_runs() -> None:
    old = bytes(10000)
    new = bytearray(old)
    new[5] = 1
    new[9] = 2
    new[4100] = 3
    new[9999] = 4
    assert list(rdma.changed_runs(old, bytes(new))) == [(5, 10), (4100, 4101), (9999, 10000)]
    assert list(rdma.changed_runs(old, old)) == []


# -- the engine alone (FakeLink) ------------------------------------------------------------------------
def _link() -> Any:
    from ib_fakeverbs import FakeLink

    from pyrds.userspace.transports.ib.engine import IbEngine

    link = FakeLink(
        IbEngine(ip(A), ip(B), send_wr=8, recv_wr=16), IbEngine(ip(B), ip(A), send_wr=8, recv_wr=16)
    )
    link.connect()
    link.pump()  # the congestion maps
    return link


def test_engine_posts_the_rdma_wr_first_and_never_retransmits_it() -> None:
    from pyrds.userspace.proto import ExtHeader
    from pyrds.userspace.transports.ib.events import MessagesAcked, RdmaCompleted
    from pyrds.userspace.transports.ib.frag import WrKind

    link = _link()
    link.b.regions[0x77] = bytearray(64)
    op = rdma.RdmaOp(True, 0x77, 8, 4, [(0, 4)], b"DATA", notify=True, token=1)
    seq = link.a.engine.queue(1, 2, b"msg", exthdr=[ExtHeader.rdma(0x77)], rdma=op)
    wrs = link.a.engine.poll_send()
    assert [w.kind for w in wrs] == [WrKind.RDMA, WrKind.DATA]
    assert wrs[0].signaled and wrs[0].rdma is op and wrs[1].seq == seq
    link.b.wire_in.extend(wrs)
    link.pump()
    assert link.b.regions[0x77][8:12] == b"DATA"
    assert link.a.rdma_done == [(op, b"")]
    # a second one, lost with the connection: after the reconnect the message is not sent again (no RDMA
    # WR either); it is released and its op reports RDS_RDMA_DROPPED
    op2 = rdma.RdmaOp(True, 0x77, 0, 4, [(0, 4)], b"LOST", notify=True, token=2)
    seq2 = link.a.engine.queue(1, 2, b"msg2", rdma=op2)
    assert [w.kind for w in link.a.engine.poll_send()] == [WrKind.RDMA, WrKind.DATA]  # never delivered
    link.disconnect()
    link.connect()
    assert [w.kind for w in link.a.engine.poll_send()] == [WrKind.CONG, WrKind.CONG]
    events = link.a.engine.take_events()
    assert [type(e) for e in events] == [MessagesAcked, RdmaCompleted]
    assert events[0].messages[0].seq == seq2  # type: ignore[union-attr]
    assert events[1] == RdmaCompleted(op2, 3)
    assert link.b.regions[0x77][:4] == bytes(4)


def test_an_mr_whose_registration_went_with_its_qp_is_forgotten() -> None:
    r = Rdma()
    baddr = page_buffer(r.keep)
    cookie = r.map_on_b(baddr, 4096)
    r.sb.mrs[uapi.rdma_cookie_key(cookie)].region.closed = True  # as after the connection's QP was destroyed
    e = errno_of(lambda: r.p.b.sendmsg(r.sb, b"d", [cmsg.rdma_dest(cookie)], 0, (ip(A), 4000), True))
    assert e == errno.EINVAL
    assert r.sb.mrs == {}


def test_the_pd_pointer_is_found_in_the_wrapping_objects_memory() -> None:
    """pyverbs_backend._pd_pointer on stand-ins: ctypes objects keep a pointer to their buffer in their own
    memory, as pyverbs' PD keeps its ``struct ibv_pd *``."""
    from pyrds.userspace.transports.ib import pyverbs_backend as pb

    class IbvPd(ctypes.Structure):
        _fields_ = (("context", ctypes.c_void_p), ("handle", ctypes.c_uint32))

    ctx = (ctypes.c_char * 64)()
    pd = IbvPd(ctypes.addressof(ctx), 7)
    assert pb._pd_pointer(pd, ctx, 7) == ctypes.addressof(pd)
    assert pb._pd_pointer(pd, ctx, 8) == 0  # not its handle
    assert pb._pd_pointer(pd, (ctypes.c_char * 64)(), 7) == 0  # a context the Context object does not hold


def test_client_memory_of_another_process_and_the_open_handler() -> None:
    """The service's side of the boundary: another process's memory by pid (as the service reads a
    client's), and OPEN keeps the connection peer's pid and uid on the socket (never the service's own)."""
    import subprocess
    import sys

    from pyrds.userspace.config import PeerCred, StackConfig
    from pyrds.userspace.service.handlers import Request, _open
    from pyrds.userspace.stack.core import Stack

    code = (
        "import ctypes,sys; b=ctypes.create_string_buffer(b'client bytes', 64); "
        "print(ctypes.addressof(b), flush=True); sys.stdin.readline(); print(b.value.decode(), flush=True)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        addr = int(child.stdout.readline())
        mem = ClientMemory(child.pid, os.getuid())
        assert mem.read(addr, 12) == b"client bytes"
        mem.write(addr, b"SERVICE")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "SERVICEbytes"
    finally:
        child.kill()
        child.wait()
    stack = Stack(StackConfig())
    req = Request(stack, None, peer=PeerCred(child.pid, 1234, 1234))
    _open(req, ())
    assert req.rs is not None and isinstance(req.rs.memory, ClientMemory)
    assert (req.rs.memory.pid, req.rs.memory.uid) == (child.pid, 1234)
    for cb in req.after_reply:
        cb()
    stack.close(req.rs)


def test_recverr_reports_a_dropped_rdma_op_without_notify_me() -> None:
    """RDS_RECVERR (``rs_recverr``): an RDMA op without NOTIFY_ME whose message is dropped (its WR failed on a
    bad r_key, the connection went down with the message unacked, and a message with an RDMA op is never
    retransmitted) is reported RDS_RDMA_DROPPED, as ``rds_send_remove_from_sock`` does (op_recverr && status);
    the REMOTE_ERROR completion itself is not (``rds_rdma_send_complete`` looks at op_notify only). Without
    RDS_RECVERR nothing is reported."""
    for recverr in (1, 0):
        r = Rdma()
        setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_RECVERR, struct.pack("i", recverr))
        aaddr = page_buffer(r.keep)
        bogus = uapi.rdma_cookie(0xBAD, 0)
        r.send(r.sa, b"x", [cmsg.rdma_args(bogus, 0, 8, iov(r.keep, (aaddr, 8)), 1, RW, 31)])
        r.send(r.sa, b"after", [])  # the connection is back and the next message goes through
        assert r.recv(r.sb)[0] == b"after"
        if recverr:
            assert r.notification() == [cmsg.RdmaNotify(31, RdmaStatus.DROPPED)]
        assert not r.sa.rdma_notify


def test_recverr_does_not_report_an_atomic() -> None:
    """``rds_send_remove_from_sock`` looks at the RDMA op's op_recverr only: a failed atomic without
    NOTIFY_ME is not reported even with RDS_RECVERR set."""
    r = Rdma()
    setsockopt(r.p.a, r.sa, SOL_RDS, SockOpt.RDS_RECVERR, struct.pack("i", 1))
    aaddr = page_buffer(r.keep)
    bogus = uapi.rdma_cookie(0xBAD, 0)
    r.send(r.sa, b"x", [cmsg.atomic_fadd(bogus, aaddr, 0, 1, 0, 32)])
    r.send(r.sa, b"after", [])
    assert r.recv(r.sb)[0] == b"after"
    assert not r.sa.rdma_notify
