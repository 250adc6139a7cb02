"""Socket options: SO_RDS_TRANSPORT, RDS_CANCEL_SENT_TO, RDMA/atomic refusal on loop, SO_TIMESTAMP, TOS."""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
import time

import pytest

from pyrds import cmsg, uapi
from pyrds.cmsg import Timestamp, parse_ancdata
from pyrds.constants import SOL_RDS, CmsgType, SockOpt, Transport
from pyrds.testing.helpers import expect_errno, sockaddr_in

SO_TIMESTAMP = 29


def test_transport_unbound_is_none(rds_socket_factory):
    s = rds_socket_factory()
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.NONE


def test_transport_loop_after_loopback_bind(rds_socket_factory):
    """A socket bound to 127.0.0.1 reports the internal loop transport (3)."""
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.LOOP


def test_transport_set_tcp_then_bind_loopback(rds_socket_factory):
    """SO_RDS_TRANSPORT=TCP before bind; TCP accepts 127.0.0.1 (a local address) and reports TCP."""
    s = rds_socket_factory()
    s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.TCP
    s.bind(("127.0.0.1", 0))
    assert s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT) == Transport.TCP


def test_transport_set_twice_eopnotsupp(rds_socket_factory):
    s = rds_socket_factory()
    s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
    expect_errno(errno.EOPNOTSUPP, s.setsockopt, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)


def test_transport_after_bind_eopnotsupp(rds_socket_factory):
    s = rds_socket_factory()
    s.bind(("127.0.0.1", 0))
    expect_errno(errno.EOPNOTSUPP, s.setsockopt, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)


@pytest.mark.parametrize("value", [-1, 3, 99], ids=["none", "loop", "99"])
def test_transport_out_of_range_einval(rds_socket_factory, value):
    s = rds_socket_factory()
    expect_errno(errno.EINVAL, s.setsockopt, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, value)


def test_transport_bad_optlen_einval(rds_socket_factory):
    s = rds_socket_factory()
    expect_errno(errno.EINVAL, s.setsockopt, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, b"\x02\x00")


def test_transport_ib_cannot_bind_loopback(rds_socket_factory, rds_observe):
    """IB: ENOPROTOOPT at setsockopt (no rds_rdma) or at bind (rds_rdma loaded, 127.0.0.1 has no RDMA
    device)."""
    s = rds_socket_factory()
    try:
        s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.IB)
    except OSError as exc:
        assert exc.errno == errno.ENOPROTOOPT
        rds_observe("ib", "setsockopt")
        return
    expect_errno(errno.ENOPROTOOPT, s.bind, ("127.0.0.1", 0))
    rds_observe("ib", "bind")


def test_unknown_sol_rds_option(rds_socket_factory):
    s = rds_socket_factory()
    expect_errno(errno.ENOPROTOOPT, s.setsockopt, SOL_RDS, 99, 1)
    expect_errno(errno.ENOPROTOOPT, s.getsockopt, SOL_RDS, 99)


# ---- cancel


def test_cancel_unbound_enotconn(rds_socket_factory):
    s = rds_socket_factory()
    expect_errno(
        errno.ENOTCONN, s.setsockopt, SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr_in("127.0.0.1", 9)
    )


def test_cancel_short_optlen_einval(rds_pair):
    a, _b = rds_pair
    expect_errno(errno.EINVAL, a.setsockopt, SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, b"\x02\x00\x00\x09")


def test_cancel_ok_and_socket_still_usable(rds_pair):
    a, b = rds_pair
    a.sendto(b"one", b.getsockname())
    host, port = b.getsockname()
    a.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr_in(host, port))
    a.sendto(b"two", b.getsockname())
    # loop delivers synchronously: "one" was already on the receiver's queue, cancel cannot take it back
    assert b.recv(10) == b"one"
    assert b.recv(10) == b"two"


# ---- RDMA / atomics on loop: refused with the kernel's errno


def test_get_mr_unbound_enotconn(rds_socket_factory):
    s = rds_socket_factory()
    expect_errno(errno.ENOTCONN, s.setsockopt, SOL_RDS, SockOpt.RDS_GET_MR, bytes(32))


def test_get_mr_on_loop_eopnotsupp(rds_pair):
    a, _b = rds_pair
    expect_errno(errno.EOPNOTSUPP, a.setsockopt, SOL_RDS, SockOpt.RDS_GET_MR, bytes(32))


def test_get_mr_bad_optlen_einval(rds_pair):
    a, _b = rds_pair
    expect_errno(errno.EINVAL, a.setsockopt, SOL_RDS, SockOpt.RDS_GET_MR, bytes(8))


def test_free_mr_on_loop_einval(rds_pair):
    """FREE_MR cookie 0 means flush: loop has no flush_mrs -> EINVAL; an unknown cookie is EINVAL too."""
    a, _b = rds_pair
    expect_errno(errno.EINVAL, a.setsockopt, SOL_RDS, SockOpt.RDS_FREE_MR, bytes(16))
    expect_errno(errno.EINVAL, a.setsockopt, SOL_RDS, SockOpt.RDS_FREE_MR, struct.pack("=QQ", 0x1234, 0))


def _pinned_buffers():
    local = ctypes.create_string_buffer(4096)
    iov = uapi.rds_iovec()
    iov.addr = ctypes.addressof(local)
    iov.bytes = 64
    return local, iov


def test_rdma_args_on_loop_eopnotsupp(rds_pair):
    a, b = rds_pair
    local, iov = _pinned_buffers()
    anc = [
        cmsg.rdma_args(
            cookie=0x100000001,
            remote_addr=0,
            remote_bytes=64,
            local_vec_addr=ctypes.addressof(iov),
            nr_local=1,
            user_token=7,
        )
    ]
    expect_errno(errno.EOPNOTSUPP, a.sendmsg, [b"rdma"], anc, 0, b.getsockname())
    del local


def test_atomic_on_loop_eopnotsupp(rds_pair):
    a, b = rds_pair
    local = ctypes.create_string_buffer(64)
    addr = (ctypes.addressof(local) + 7) & ~7
    anc = [
        cmsg.build(
            cmsg.AtomicArgs(
                kind=CmsgType.RDS_CMSG_ATOMIC_FADD, cookie=0x100000001, local_addr=addr, remote_addr=0, add=1
            )
        )
    ]
    expect_errno(errno.EOPNOTSUPP, a.sendmsg, [b""], anc, 0, b.getsockname())


def test_rdma_dest_unknown_cookie_einval(rds_pair):
    a, b = rds_pair
    expect_errno(errno.EINVAL, a.sendmsg, [b"x"], [cmsg.rdma_dest(0x1234)], 0, b.getsockname())


def test_unknown_cmsg_type_einval(rds_pair):
    a, b = rds_pair
    expect_errno(errno.EINVAL, a.sendmsg, [b"x"], [(SOL_RDS, 99, bytes(8))], 0, b.getsockname())


def test_zerocopy_on_loop_eopnotsupp(rds_pair):
    """With SO_ZEROCOPY set, MSG_ZEROCOPY on a non-TCP transport is EOPNOTSUPP."""
    a, b = rds_pair
    a.setsockopt(socket.SOL_SOCKET, 60, 1)  # SO_ZEROCOPY
    expect_errno(errno.EOPNOTSUPP, a.sendmsg, [b"zc"], [cmsg.zcopy_cookie(1)], 0x4000000, b.getsockname())


# ---- timestamps and TOS


def test_so_timestamp(rds_pair):
    a, b = rds_pair
    b.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    before = time.time()
    a.sendto(b"ts", b.getsockname())
    data, anc, _flags, _addr = b.recvmsg(10, 256)
    assert data == b"ts"
    stamps = [p for p in parse_ancdata(anc) if isinstance(p, Timestamp)]
    assert len(stamps) == 1, anc
    assert before - 1 <= stamps[0].time <= time.time() + 1


def test_no_timestamp_by_default(rds_pair):
    a, b = rds_pair
    a.sendto(b"ts", b.getsockname())
    _data, anc, _flags, _addr = b.recvmsg(10, 256)
    assert anc == []


def test_tos_unbound_enotty(rds_socket_factory):
    """SIOCRDSSETTOS needs a transport with a TOS map: unbound -> ENOIOCTLCMD, seen as ENOTTY; GETTOS is 0."""
    s = rds_socket_factory()
    assert s.get_tos() == 0
    expect_errno(errno.ENOTTY, s.set_tos, 3)


def test_tos_loop_enotty(rds_pair):
    """The loop transport has no get_tos_map either: ENOTTY."""
    a, _b = rds_pair
    expect_errno(errno.ENOTTY, a.set_tos, 3)


def test_tos_tcp_maps_to_zero(rds_socket_factory, rds_observe):
    """TCP maps every user TOS to 0 (rds_tcp_get_tos_map), so set_tos succeeds and get_tos reads 0."""
    s = rds_socket_factory()
    s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
    s.bind(("127.0.0.1", 0))
    s.set_tos(3)
    rds_observe("tos", s.get_tos())
    assert s.get_tos() == 0
