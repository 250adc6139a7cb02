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

    def mapped_page(self) -> tuple[int, int, int, Any]:
        """A page of B mapped (its address, a page of A's, the cookie) and A's queue pair, its sent SENDs
        cleared."""
        baddr = page_buffer(self.keep)
        aaddr = page_buffer(self.keep)
        cookie = self.map_on_b(baddr, 4096)
        qp = next(q for q in self.p.fabric.qps if q.src == A and not q.closed)
        qp.sent.clear()
        return baddr, aaddr, cookie, qp

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
    baddr, aaddr, cookie, qp = r.mapped_page()
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


def test_a_silent_op_without_payload_or_cookie_posts_no_send() -> None:
    """RDS_RDMA_SILENT (rds_send_xmit: "exclusively attached silent ops"): a message with no payload whose
    RDMA op is SILENT and that carries no cookie posts the RDMA WR and no SEND; the requester still gets its
    notification, the target receives nothing for it, and the ack of the next message releases it. With a
    payload, or without SILENT, the message goes out as usual."""
    r = Rdma()
    baddr, aaddr, cookie, qp = r.mapped_page()
    ctypes.memmove(aaddr, b"S" * 64, 64)
    silent = RW | NOTIFY | RdmaFlag.SILENT
    assert r.send(r.sa, b"", [cmsg.rdma_args(cookie, 0, 64, iov(r.keep, (aaddr, 64)), 1, silent, 91)]) == 0
    # done, but its status waits for a later SEND's completion (the kernel leaves a NOTIFY_ME WRITE
    # unsignalled and reaps it with the next signalled WR of the ring)
    assert not r.sa.rdma_notify
    # (the WRITE is in the service's copy of B's MR; B's client sees it once a later message shows the gap)
    assert ctypes.string_at(baddr, 64) == bytes(64)
    assert qp.sent == []  # the WRITE only: no SEND, not even an ACK-only frame for it
    assert not r.sb.recv_queue
    assert len(r.sa.sent) == 1  # its sequence number is taken: held until a later message's ack
    engine = r.p.ib_a.nodes[ip(A)].engines[ip(B)]
    assert engine.counters["ib_tx_silent"] == 1
    r.send(r.sa, b"next", [])
    assert r.notification() == [cmsg.RdmaNotify(91, RdmaStatus.SUCCESS)]
    assert r.recv(r.sb) == (b"next", [])  # the target sees the gap in sequence numbers and takes it
    assert ctypes.string_at(baddr, 64) == b"S" * 64  # ... and syncs its MRs before delivering the message
    assert r.p.b.counters["rdma_mr_gap_sync"] == 1
    r.send(r.sb, b"ack", [])
    assert r.recv(r.sa)[0] == b"ack"
    assert not r.sa.sent  # acked with the message after it
    # with a payload, or not SILENT, the message goes out (and reaches the target)
    r.send(r.sa, b"p", [cmsg.rdma_args(cookie, 0, 8, iov(r.keep, (aaddr, 8)), 1, RW | RdmaFlag.SILENT)])
    assert r.recv(r.sb) == (b"p", [])
    r.send(r.sa, b"", [cmsg.rdma_args(cookie, 0, 8, iov(r.keep, (aaddr, 8)), 1, RW)])
    assert r.recv(r.sb) == (b"", [])
    assert engine.counters["ib_tx_silent"] == 1


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
    # message here); a masked one's local word as a plain one's (masked atomics themselves work: below)
    fadd = cmsg.atomic_fadd(cookie, aaddr, 0, 1)
    mfadd = cmsg.masked_atomic_fadd(cookie, aaddr, 0, 1, 0xFF)
    assert send([(SOL_RDS, fadd[1], fadd[2][:64])]) == errno.EINVAL
    assert send([fadd, fadd]) == errno.EINVAL and send([mfadd, fadd]) == errno.EINVAL
    assert send([fadd, two]) == errno.EOPNOTSUPP and send([two, fadd]) == errno.EOPNOTSUPP
    assert send([mfadd, two]) == errno.EOPNOTSUPP
    assert send([cmsg.masked_atomic_fadd(cookie, 0x1000, 0, 1, 0xFF)]) == errno.EFAULT
    assert send([cmsg.masked_atomic_cswp(cookie, aaddr + 4, 0, 1, 2, 3, 0xFF)]) == errno.EFAULT
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
        "fadd",
        "cswp",
        "cswp",
        "fadd",
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


# -- masked atomics: emulated with plain ones (stack.rdma.MaskedAtomic, the driver's chain) ------------------
ONES = (1 << 64) - 1
#: two 32-bit fields: bit 31 ends the low one (its carry does not reach the high one), bit 63 the high one
TWO_FIELDS = (1 << 31) | (1 << 63)


def _word(addr: int) -> int:
    return int.from_bytes(ctypes.string_at(addr, 8), "little")


def _set_word(addr: int, value: int) -> None:
    ctypes.memmove(addr, value.to_bytes(8, "little"), 8)


def _qp_of(r: Rdma) -> Any:
    """A's live QP (the requester's)."""
    return next(q for q in r.p.fabric.qps if q.src == A and not q.closed)


def _peer_word(qp: Any, rkey: int, addr: int) -> int:
    return int.from_bytes(qp.peer.regions[rkey].buf[addr : addr + 8], "little")


def _bump_peer_word(qp: Any, rkey: int, addr: int, add: int) -> None:
    """Another requester's plain fetch-and-add on the word (between two steps of A's chain)."""
    region = qp.peer.regions[rkey]
    region.buf[addr : addr + 8] = ((_peer_word(qp, rkey, addr) + add) & ONES).to_bytes(8, "little")


class _MaskedCase:
    """A's masked atomic on a word of B's MR (at ``WORD``), watching A's QP: which atomics it posts, and
    whether the op's message was posted before each of them (it must wait for the chain's end)."""

    WORD = 64

    def __init__(self, start: int) -> None:
        self.r = Rdma()
        self.baddr = page_buffer(self.r.keep)
        self.aaddr = page_buffer(self.r.keep)
        _set_word(self.baddr + self.WORD, start)
        _set_word(self.aaddr, 0xA5A5A5A5A5A5A5A5)
        self.cookie = self.r.map_on_b(self.baddr, 4096)
        self.qp = _qp_of(self.r)
        self.qp.rdma_posted.clear()
        self.message_before_step: list[bool] = []
        self.meddle: Any = None  # called with the step index (0: the read) before each atomic
        self.qp.before_atomic = self._before

    def _before(self, rkey: int, addr: int, fetch_add: bool) -> None:
        self.message_before_step.append(any(b"masked" in sent[2] for sent in self.qp.sent))
        if self.meddle is not None:
            self.meddle(len(self.message_before_step) - 1, rkey, addr)

    def send(self, anc: Any) -> None:
        self.r.send(self.r.sa, b"masked", [anc])

    @property
    def steps(self) -> list[str]:
        return [str(w[1]) for w in self.qp.rdma_posted]

    def counters(self) -> Any:
        return self.r.p.ib_a.stat_counters()


def test_masked_fetch_add_two_fields_the_low_one_overflows_alone() -> None:
    """RDS_CMSG_MASKED_ATOMIC_FADD with nocarry bits 31 and 63: two independent 32-bit fields; the low one
    wraps without carrying into the high one. Done as a read (fetch-and-add 0) and one compare-and-swap,
    the message posted only after them; the original value lands in A's word, SUCCESS, and B's client sees
    the new word when the message arrives."""
    start = (7 << 32) | 0xFFFFFFF0
    c = _MaskedCase(start)
    add = (2 << 32) | 0x20
    c.send(cmsg.masked_atomic_fadd(c.cookie, c.aaddr, c.WORD, add, TWO_FIELDS, NOTIFY, 30))
    data, _anc = c.r.recv(c.r.sb)
    assert data == b"masked"
    assert _word(c.baddr + c.WORD) == (9 << 32) | 0x10  # low: 0xfffffff0 + 0x20 wraps; high: 7 + 2
    assert _word(c.aaddr) == start
    assert c.r.notification() == [cmsg.RdmaNotify(30, RdmaStatus.SUCCESS)]
    assert c.steps == ["fadd", "cswp"] and c.message_before_step == [False, False]
    counters = c.counters()
    assert (counters["ib_atomic_fadd"], counters["ib_atomic_cswp"]) == (1, 0)  # one per op, by its type
    assert (counters["ib_atomic_masked"], counters["ib_atomic_masked_retry"]) == (1, 0)


def test_masked_compare_swap_of_some_bits_and_a_failed_masked_compare() -> None:
    """RDS_CMSG_MASKED_ATOMIC_CSWP comparing only the low byte and swapping only bits 8-15: the other bits
    stay; then one whose masked compare fails: done after the read, no write, the original value back."""
    start = 0x1122334455667788
    c = _MaskedCase(start)
    # compare 0x...88 on the low byte only (the rest of compare differs: ignored), swap in 0xAB at bits 8-15
    c.send(cmsg.masked_atomic_cswp(c.cookie, c.aaddr, c.WORD, 0xFFFF88, 0xABAB, 0xFF, 0xFF00, NOTIFY, 31))
    assert c.r.recv(c.r.sb)[0] == b"masked"
    assert _word(c.baddr + c.WORD) == 0x112233445566AB88
    assert _word(c.aaddr) == start
    assert c.r.notification() == [cmsg.RdmaNotify(31, RdmaStatus.SUCCESS)]
    assert c.steps == ["fadd", "cswp"] and c.message_before_step == [False, False]
    c.qp.rdma_posted.clear()
    c.message_before_step.clear()
    _set_word(c.aaddr + 8, 0)
    # compare bit 0 (the word's is 0, compare's 1): fails; the swap mask would change everything
    c.send(cmsg.masked_atomic_cswp(c.cookie, c.aaddr + 8, c.WORD, 1, ONES, 1, ONES, NOTIFY, 32))
    assert c.r.recv(c.r.sb)[0] == b"masked"
    assert _word(c.baddr + c.WORD) == 0x112233445566AB88
    assert _word(c.aaddr + 8) == 0x112233445566AB88
    assert c.r.notification() == [cmsg.RdmaNotify(32, RdmaStatus.SUCCESS)]
    assert c.steps == ["fadd"]
    assert c.counters()["ib_atomic_cswp"] == 2 and c.counters()["ib_atomic_masked"] == 2


def test_a_masked_atomic_that_loses_a_race_retries_from_the_value_the_swap_saw() -> None:
    """Another atomic changes the word between A's read and A's swap: the swap fails and returns the new
    value, and the next swap is computed from it (no new read). The result is the value the successful swap
    replaced, and the word is the masked sum of it: linearizable against the other atomic."""
    c = _MaskedCase(0x100000001)

    def meddle(step: int, rkey: int, addr: int) -> None:
        if step == 1:  # right before A's first swap
            _bump_peer_word(c.qp, rkey, addr, 0x500000005)

    c.meddle = meddle
    c.send(cmsg.masked_atomic_fadd(c.cookie, c.aaddr, c.WORD, 0xFFFFFFFF, TWO_FIELDS, NOTIFY, 33))
    assert c.r.recv(c.r.sb)[0] == b"masked"
    assert _word(c.aaddr) == 0x600000006  # the value the swap took effect on
    assert _word(c.baddr + c.WORD) == 0x600000005  # low field 6 + 0xffffffff wraps to 5, no carry
    assert c.r.notification() == [cmsg.RdmaNotify(33, RdmaStatus.SUCCESS)]
    assert c.steps == ["fadd", "cswp", "cswp"] and c.message_before_step == [False] * 3
    assert c.counters()["ib_atomic_masked_retry"] == 1 and c.counters()["ib_atomic_fadd"] == 1


def test_a_masked_atomic_gives_up_after_its_swaps_with_other_error() -> None:
    """The word changes before every swap: after MAX_MASKED_SWAPS failed swaps the op ends with
    RDS_RDMA_OTHER_ERROR, A's local word untouched; the message still goes, the connection stays up."""
    c = _MaskedCase(0)

    def meddle(step: int, rkey: int, addr: int) -> None:
        if step >= 1:
            _bump_peer_word(c.qp, rkey, addr, 1)

    c.meddle = meddle
    c.send(cmsg.masked_atomic_cswp(c.cookie, c.aaddr, c.WORD, 0, ONES, 0, 0xF0, NOTIFY, 34))
    assert c.r.recv(c.r.sb)[0] == b"masked"
    assert c.r.notification() == [cmsg.RdmaNotify(34, RdmaStatus.OTHER_ERROR)]
    assert _word(c.aaddr) == 0xA5A5A5A5A5A5A5A5
    assert c.steps == ["fadd"] + ["cswp"] * rdma.MAX_MASKED_SWAPS
    assert _word(c.baddr + c.WORD) == rdma.MAX_MASKED_SWAPS  # only the other requester's adds
    counters = c.counters()
    assert counters["ib_atomic_masked_retry"] == rdma.MAX_MASKED_SWAPS - 1
    assert (counters["ib_atomic_masked_gave_up"], counters["ib_atomic_cswp"]) == (1, 1)
    assert _qp_of(c.r) is c.qp  # no reconnect
    c.r.send(c.r.sa, b"after")
    assert c.r.recv(c.r.sb)[0] == b"after"


def test_a_remote_error_in_a_later_step_ends_the_masked_op_as_a_plain_ones() -> None:
    """B's region goes away between A's read and A's swap: the swap completes with a remote access error,
    the op with RDS_RDMA_REMOTE_ERROR (A's word untouched), and the connection drops and comes back."""
    c = _MaskedCase(5)

    def meddle(step: int, rkey: int, addr: int) -> None:
        if step == 1:
            c.qp.peer.regions[rkey].close()

    c.meddle = meddle
    c.send(cmsg.masked_atomic_fadd(c.cookie, c.aaddr, c.WORD, 1, TWO_FIELDS, NOTIFY, 35))
    assert c.r.notification() == [cmsg.RdmaNotify(35, RdmaStatus.REMOTE_ERROR)]
    assert _word(c.aaddr) == 0xA5A5A5A5A5A5A5A5
    assert c.steps == ["fadd", "cswp"]
    assert c.counters()["ib_atomic_fadd"] == 1
    c.r.send(c.r.sa, b"after")
    assert c.r.recv(c.r.sb)[0] == b"after"


def test_a_failed_post_of_a_later_step_drops_the_connection_and_the_op() -> None:
    """Posting a masked op's swap fails (a verbs error): the connection drops as for any failed post; after
    the reconnect the op's message is not sent (never retransmitted with an op) and the op reports
    RDS_RDMA_DROPPED, as a plain atomic's lost with its connection."""
    from pyrds.userspace.transports.ib.verbs import VerbsError

    c = _MaskedCase(5)

    def meddle(step: int, rkey: int, addr: int) -> None:
        if step == 1:
            raise VerbsError("ibv_post_send (atomic): injected", 12)

    c.meddle = meddle
    c.send(cmsg.masked_atomic_fadd(c.cookie, c.aaddr, c.WORD, 1, TWO_FIELDS, NOTIFY, 36))
    assert c.r.p.ib_a.stat_counters()["ib_verbs_error"] == 1
    assert c.qp.regions == {}  # the bounce buffer was freed
    c.r.send(c.r.sa, b"after")
    assert c.r.recv(c.r.sb)[0] == b"after"
    assert c.r.notification() == [cmsg.RdmaNotify(36, RdmaStatus.DROPPED)]
    assert _word(c.aaddr) == 0xA5A5A5A5A5A5A5A5


def _fadd_reference(old: int, add: int, nocarry: int) -> int:
    """Masked fetch-and-add one bit at a time: the carry out of bit i is dropped where nocarry has bit i."""
    out, carry = 0, 0
    for i in range(64):
        total = (old >> i & 1) + (add >> i & 1) + carry
        out |= (total & 1) << i
        carry = 0 if nocarry >> i & 1 else total >> 1
    return out


def test_masked_fadd_bit_by_bit() -> None:
    """Every 4-bit word, addend and mask, at the bottom of the word and at its top (where a carry out of
    bit 63 wraps away), and random 64-bit cases, against the bit-at-a-time reference."""
    import random

    for shift in (0, 30, 60):
        for old in range(16):
            for add in range(16):
                for mask in range(16):
                    o, a, m = old << shift, add << shift, mask << shift
                    assert rdma.masked_fadd(o, a, m) == _fadd_reference(o, a, m), (hex(o), hex(a), hex(m))
    rng = random.Random(9)
    for _ in range(3000):
        o, a, m = rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64) & rng.getrandbits(64)
        assert rdma.masked_fadd(o, a, m) == _fadd_reference(o, a, m)


def test_masked_fadd_fields() -> None:
    f = rdma.masked_fadd
    assert f(41, 1, 0) == 42 and f(ONES, 1, 0) == 0 and f(ONES, ONES, 0) == ONES - 1  # plain, wrapping
    assert f(0xFFFFFFFF, 1, TWO_FIELDS) == 0  # the low field wraps, the high one keeps 0
    assert f(0xFFFFFFFF, 1, 1 << 63) == 1 << 32  # one field: the carry crosses bit 31
    assert f(ONES, 1 << 32, TWO_FIELDS) == 0xFFFFFFFF  # the high field wraps at bit 63
    assert f(0x80, 0x80, 1 << 7) == 0  # a one-field carry out of its top bit is lost
    assert f(0x80, 0x80, 1 << 8) == 0x100  # ... but not when the field is wider
    assert f(0xFF, 0x01, 0xFF) == 0xFE  # eight 1-bit fields: each bit is xor, no carries at all
    assert f(0x0F0F, 0x0101, 0x8888) == 0x0000  # 4-bit fields: 0xf+1 wraps twice, 0+0 stays
    assert f(1 << 64 | 3, 1, 0) == 4  # inputs are taken modulo 2^64


def test_masked_cswp_bits() -> None:
    g = rdma.masked_cswp
    assert g(5, 5, 9, ONES, ONES) == 9 and g(5, 6, 9, ONES, ONES) == 5  # plain
    assert g(0xAB, 0x0B, 0xFF00, 0x0F, 0xFF00) == 0xFFAB  # only the low nibble compared, bits 8-15 swapped
    assert g(0xAB, 0x0C, 0xFF00, 0x0F, 0xFF00) == 0xAB  # the low nibble differs: unchanged
    assert g(0xAB, 0, 0, 0, 0xF0) == 0x0B  # no compare bits: always swaps
    assert g(0xAB, 0xAB, 0x1234, ONES, 0) == 0xAB  # no swap bits: never changes
    assert g(ONES, ONES, 0, 1 << 63, 1 << 63) == ONES >> 1  # bit 63
    for old in range(16):  # every 4-bit case against the definition
        for cmp_mask in range(16):
            for swap_mask in range(16):
                hit = (old ^ 0b1010) & cmp_mask == 0
                expect = (old & ~swap_mask | 0b0110 & swap_mask) if hit else old
                assert g(old, 0b1010, 0b0110, cmp_mask, swap_mask) == expect


def _atomic(kind: int, a: int, b: int = 0, mask: int = 0, mask2: int = ONES) -> rdma.RdmaOp:
    op = rdma.RdmaOp(False, 1, 0, 8, [(0, 8)], atomic=kind, compare_add=a, swap=b)
    if kind == rdma.ATOMIC_FADD:
        op.nocarry_mask = mask
    else:
        op.compare_mask, op.swap_mask = mask, mask2
    return op


def test_masked_atomic_chain_steps() -> None:
    """The sans-IO chain: read, swap, done; each way to end."""
    assert not _atomic(rdma.ATOMIC_FADD, 1).masked and _atomic(rdma.ATOMIC_FADD, 1, 0, 1).masked
    assert not _atomic(rdma.ATOMIC_CSWP, 1, 2, ONES, ONES).masked
    assert _atomic(rdma.ATOMIC_CSWP, 1, 2, ONES, 1).masked and _atomic(rdma.ATOMIC_CSWP, 1, 2, 1, ONES).masked
    assert not rdma.RdmaOp(True, 1, 0, 8, [(0, 8)]).masked
    # FADD of two fields: read 0xffffffff, swap it for 0, the swap saw the expected value: done
    chain = rdma.MaskedAtomic(_atomic(rdma.ATOMIC_FADD, 1, 0, TWO_FIELDS))
    assert chain.first() == rdma.READ_STEP == rdma.AtomicStep(True, 0)
    assert chain.advance(0xFFFFFFFF) == rdma.AtomicStep(False, 0xFFFFFFFF, 0)
    assert chain.advance(0xFFFFFFFF) is None
    assert (chain.result, chain.status, chain.swaps, chain.retries, chain.done) == (0xFFFFFFFF, 0, 1, 0, True)
    with pytest.raises(ValueError):
        chain.advance(0)
    # the swap saw another value: the next swap starts from it; then the compare fails on a third value
    chain = rdma.MaskedAtomic(_atomic(rdma.ATOMIC_CSWP, 0, 0xF0, 0x1, 0xF0))
    assert chain.advance(2) == rdma.AtomicStep(False, 2, 0xF2)
    assert chain.advance(4) == rdma.AtomicStep(False, 4, 0xF4)
    assert chain.advance(5) is None  # bit 0 set: the compare fails at the failed swap's read of 5
    assert (chain.result, chain.status, chain.retries) == (5, 0, 1)
    # nothing to change (adding 0 in every field): done after the read
    chain = rdma.MaskedAtomic(_atomic(rdma.ATOMIC_FADD, 0, 0, TWO_FIELDS))
    assert chain.advance(123) is None and chain.result == 123 and chain.swaps == 0
    # a bounded number of swaps, then OTHER_ERROR and no result
    chain = rdma.MaskedAtomic(_atomic(rdma.ATOMIC_FADD, 1, 0, 1 << 63), max_swaps=3)
    steps = [chain.advance(v) for v in (10, 20, 30, 40)]
    assert steps == [rdma.AtomicStep(False, v, v + 1) for v in (10, 20, 30)] + [None]
    assert (chain.result, chain.status, chain.swaps, chain.done) == (None, RdmaStatus.OTHER_ERROR, 3, True)
    with pytest.raises(ValueError):
        rdma.MaskedAtomic(rdma.RdmaOp(True, 1, 0, 8, [(0, 8)]))
    with pytest.raises(ValueError):
        rdma.MaskedAtomic(_atomic(rdma.ATOMIC_FADD, 1, 0, 1), max_swaps=0)


def test_the_engine_holds_a_masked_atomics_message_until_its_chain_ends() -> None:
    """A plain atomic's WR and its message's SEND go out together (RC orders them); a masked one's message
    waits for send_complete of the op's WR (the driver calls it when the chain ended), and so does
    everything queued after it; an ACK frame still goes."""
    from pyrds.userspace.transports.ib.frag import WrKind

    link = _link()
    engine = link.a.engine
    plain = _atomic(rdma.ATOMIC_FADD, 1)
    engine.queue(1, 2, b"plain", rdma=plain)
    wrs = engine.poll_send()
    assert [w.kind for w in wrs] == [WrKind.RDMA, WrKind.DATA]
    for w in wrs:
        if w.signaled:
            engine.send_complete(w.wr_id)
    masked = _atomic(rdma.ATOMIC_FADD, 1, 0, TWO_FIELDS)
    engine.queue(1, 2, b"masked", rdma=masked)
    engine.queue(1, 2, b"next")
    wrs = engine.poll_send()
    assert [w.kind for w in wrs] == [WrKind.RDMA] and wrs[0].rdma is masked
    assert engine.poll_send() == []
    # B's first message asks for an ACK (ACK_REQUIRED): A's ACK frame is not held
    link.b.engine.queue(2, 1, b"hi")
    link.post(link.b)
    assert link.deliver_one(link.a) is not None
    assert [w.kind for w in engine.poll_send()] == [WrKind.ACK]
    engine.send_complete(wrs[0].wr_id)
    assert [w.data[48:] for w in engine.poll_send()] == [b"masked", b"next"]


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
