"""pyrds.cmsg: builders produce the kernel layout, parsers invert them."""

from __future__ import annotations

import ctypes
import socket
import struct

import pytest

from pyrds import cmsg, uapi
from pyrds.constants import SOL_RDS, CmsgType

TYPED = [
    cmsg.RdmaArgs(0x1_0000_0002, 0x1000, 4096, 0xDEAD000, 2, 0x21, 77),
    cmsg.RdmaDest(uapi.rdma_cookie(0xABC, 0x10)),
    cmsg.RdmaMap(0x7000, 8192, 0x8000, 0x9),
    cmsg.RdmaNotify(5, 2),
    cmsg.RdmaNotify(5, -1),
    cmsg.CongUpdate(1 << 63 | 5),
    cmsg.AtomicArgs(CmsgType.RDS_CMSG_ATOMIC_FADD, 1, 2, 3, add=4, flags=0x20, user_token=9),
    cmsg.AtomicArgs(CmsgType.RDS_CMSG_ATOMIC_CSWP, 1, 2, 3, compare=4, swap=5),
    cmsg.AtomicArgs(CmsgType.RDS_CMSG_MASKED_ATOMIC_FADD, 1, 2, 3, add=4, nocarry_mask=0xF0),
    cmsg.AtomicArgs(
        CmsgType.RDS_CMSG_MASKED_ATOMIC_CSWP, 1, 2, 3, compare=4, swap=5, compare_mask=6, swap_mask=7
    ),
    cmsg.RxTrace((0, 2), (100, 200)),
    cmsg.RxTrace((), ()),
    cmsg.ZcopyCookie(0xFFFFFFFF),
    cmsg.ZcopyCompletion((1, 2, 3)),
    cmsg.ZcopyCompletion(tuple(range(8))),
    cmsg.Timestamp(1_700_000_000, 999_999),
]


@pytest.mark.parametrize("value", TYPED, ids=lambda v: type(v).__name__)
def test_roundtrip(value: object) -> None:
    level, ctype, data = cmsg.build(value)
    assert cmsg.parse_ancdata([(level, ctype, data)]) == [value]


def test_sizes_and_types() -> None:
    assert cmsg.rdma_args(1, 2, 3, 4, 1)[1:] == (
        CmsgType.RDS_CMSG_RDMA_ARGS,
        cmsg.rdma_args(1, 2, 3, 4, 1)[2],
    )
    assert len(cmsg.rdma_args(1, 2, 3, 4, 1)[2]) == 56
    assert len(cmsg.atomic_fadd(1, 2, 3, 4)[2]) == 72
    assert len(cmsg.rdma_map(1, 2, 3)[2]) == 32
    assert len(cmsg.rdma_status(1, 0)[2]) == 16
    assert len(cmsg.zcopy_completion([1])[2]) == 36
    assert len(cmsg.rx_trace([1], [2])[2]) == 32
    assert cmsg.cong_update(3) == (SOL_RDS, CmsgType.RDS_CMSG_CONG_UPDATE, struct.pack("=Q", 3))
    assert cmsg.zcopy_cookie(7) == (SOL_RDS, CmsgType.RDS_CMSG_ZCOPY_COOKIE, struct.pack("=I", 7))
    assert cmsg.timestamp(1, 2)[:2] == (socket.SOL_SOCKET, 29)


def test_rdma_args_layout() -> None:
    data = cmsg.rdma_args(
        cookie=1, remote_addr=2, remote_bytes=3, local_vec_addr=4, nr_local=5, flags=6, user_token=7
    )[2]
    assert struct.unpack("=7Q", data) == (1, 2, 3, 4, 5, 6, 7)


def test_atomic_union_layout() -> None:
    data = cmsg.masked_atomic_cswp(1, 2, 3, 4, 5, 6, 7, 8, 9)[2]
    assert struct.unpack("=9Q", data) == (1, 2, 3, 4, 5, 6, 7, 8, 9)
    data = cmsg.atomic_fadd(1, 2, 3, 4, 8, 9)[2]
    assert struct.unpack("=9Q", data) == (1, 2, 3, 4, 0, 0, 0, 8, 9)


def test_rx_trace_so() -> None:
    assert cmsg.rx_trace_so([0, 2]) == bytes([2, 0, 2, 0])
    assert len(cmsg.rx_trace_so([])) == ctypes.sizeof(uapi.rds_rx_trace_so)
    with pytest.raises(ValueError):
        cmsg.rx_trace_so([0, 1, 2, 0])


def test_bad_values() -> None:
    with pytest.raises(ValueError):
        cmsg.zcopy_cookie(1 << 32)
    with pytest.raises(ValueError):
        cmsg.cong_update(-1)
    with pytest.raises(TypeError):
        cmsg.rdma_dest("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cmsg.zcopy_completion(range(9))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cmsg.parse_cmsg(SOL_RDS, CmsgType.RDS_CMSG_RDMA_STATUS, b"\0" * 8)
    with pytest.raises(TypeError):
        cmsg.build(object())


def test_unknown_passthrough() -> None:
    assert cmsg.parse_ancdata([(SOL_RDS, 99, b"x")]) == [cmsg.UnknownCmsg(SOL_RDS, 99, b"x")]
    assert cmsg.parse_ancdata([(0, 1, b"y")]) == [cmsg.UnknownCmsg(0, 1, b"y")]


def test_cookie_helpers() -> None:
    d = cmsg.RdmaDest(cmsg.rdma_cookie(0x55, 0x66))
    assert (d.r_key, d.offset) == (0x55, 0x66)
