"""Builders and parsers for every RDS control message.

Builders return ``(level, type, bytes)`` tuples usable directly as ``sendmsg`` ancdata (both backends);
:func:`parse_ancdata` turns the ancdata returned by ``recvmsg`` into typed objects. The bytes are the kernel's
struct layouts (:mod:`pyrds.uapi`).
"""

from __future__ import annotations

import ctypes
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyrds import uapi
from pyrds.constants import RDS_MAX_ZCOOKIES, SOL_RDS, CmsgType, RdmaStatus
from pyrds.constants import SO_TIMESTAMP_NEW as SO_TIMESTAMP_NEW  # defined here before: still importable
from pyrds.constants import SO_TIMESTAMP_OLD as SO_TIMESTAMP_OLD

Cmsg = tuple[int, int, bytes]

_U64 = (1 << 64) - 1


def _check_u(name: str, value: int, bits: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name} must fit in an unsigned {bits}-bit integer")
    return value


# ---- typed values


@dataclass(frozen=True, slots=True)
class RdmaArgs:
    """``RDS_CMSG_RDMA_ARGS``: an RDMA read/write against the peer's MR ``cookie``."""

    cookie: int
    remote_addr: int
    remote_bytes: int
    local_vec_addr: int
    nr_local: int
    flags: int = 0
    user_token: int = 0


@dataclass(frozen=True, slots=True)
class RdmaDest:
    """``RDS_CMSG_RDMA_DEST``: an MR cookie sent with (or received from) a message."""

    cookie: int

    @property
    def r_key(self) -> int:
        return uapi.rdma_cookie_key(self.cookie)

    @property
    def offset(self) -> int:
        return uapi.rdma_cookie_offset(self.cookie)


@dataclass(frozen=True, slots=True)
class RdmaMap:
    """``RDS_CMSG_RDMA_MAP``: register ``(addr, bytes)`` and write the cookie to ``cookie_addr``."""

    addr: int
    bytes: int
    cookie_addr: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class RdmaNotify:
    """``RDS_CMSG_RDMA_STATUS`` (``rds_rdma_notify``): completion of an RDMA/atomic op with NOTIFY_ME."""

    user_token: int
    status: int

    @property
    def status_name(self) -> str:
        try:
            return RdmaStatus(self.status).name
        except ValueError:
            return str(self.status)


@dataclass(frozen=True, slots=True)
class CongUpdate:
    """``RDS_CMSG_CONG_UPDATE``: u64 mask of monitored ports whose congestion state changed."""

    mask: int


@dataclass(frozen=True, slots=True)
class AtomicArgs:
    """``RDS_CMSG_ATOMIC_*`` / ``RDS_CMSG_MASKED_ATOMIC_*`` (``rds_atomic_args``)."""

    kind: CmsgType
    cookie: int
    local_addr: int
    remote_addr: int
    compare: int = 0  # cswp/m_cswp
    swap: int = 0  # cswp/m_cswp
    add: int = 0  # fadd/m_fadd
    compare_mask: int = 0  # m_cswp
    swap_mask: int = 0  # m_cswp
    nocarry_mask: int = 0  # m_fadd
    flags: int = 0
    user_token: int = 0


@dataclass(frozen=True, slots=True)
class RxTrace:
    """``RDS_CMSG_RXPATH_LATENCY`` (``rds_cmsg_rx_trace``): ``positions`` and their ``values`` (ns)."""

    positions: tuple[int, ...]
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ZcopyCookie:
    """``RDS_CMSG_ZCOPY_COOKIE``: u32 cookie attached to a MSG_ZEROCOPY send."""

    cookie: int


@dataclass(frozen=True, slots=True)
class ZcopyCompletion:
    """``RDS_CMSG_ZCOPY_COMPLETION`` (``rds_zcopy_cookies``): cookies of completed zerocopy sends."""

    cookies: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Timestamp:
    """``SOL_SOCKET/SO_TIMESTAMP`` (struct timeval) on received messages."""

    sec: int
    usec: int

    @property
    def time(self) -> float:
        return self.sec + self.usec / 1e6


@dataclass(frozen=True, slots=True)
class UnknownCmsg:
    level: int
    type: int
    data: bytes


# ---- builders


def rdma_args(
    cookie: int,
    remote_addr: int,
    remote_bytes: int,
    local_vec_addr: int,
    nr_local: int,
    flags: int = 0,
    user_token: int = 0,
) -> Cmsg:
    st = uapi.rds_rdma_args()
    st.cookie = _check_u("cookie", cookie, 64)
    st.remote_vec.addr = _check_u("remote_addr", remote_addr, 64)
    st.remote_vec.bytes = _check_u("remote_bytes", remote_bytes, 64)
    st.local_vec_addr = _check_u("local_vec_addr", local_vec_addr, 64)
    st.nr_local = _check_u("nr_local", nr_local, 64)
    st.flags = _check_u("flags", flags, 64)
    st.user_token = _check_u("user_token", user_token, 64)
    return (SOL_RDS, CmsgType.RDS_CMSG_RDMA_ARGS, uapi.to_bytes(st))


def rdma_dest(cookie: int) -> Cmsg:
    return (SOL_RDS, CmsgType.RDS_CMSG_RDMA_DEST, struct.pack("=Q", _check_u("cookie", cookie, 64)))


def rdma_map(addr: int, nbytes: int, cookie_addr: int, flags: int = 0) -> Cmsg:
    st = uapi.rds_get_mr_args()
    st.vec.addr = _check_u("addr", addr, 64)
    st.vec.bytes = _check_u("bytes", nbytes, 64)
    st.cookie_addr = _check_u("cookie_addr", cookie_addr, 64)
    st.flags = _check_u("flags", flags, 64)
    return (SOL_RDS, CmsgType.RDS_CMSG_RDMA_MAP, uapi.to_bytes(st))


def rdma_status(user_token: int, status: int) -> Cmsg:
    """Build an ``RDS_CMSG_RDMA_STATUS`` payload (what the kernel/userspace backend delivers)."""
    st = uapi.rds_rdma_notify()
    st.user_token = _check_u("user_token", user_token, 64)
    if not isinstance(status, int) or not -(1 << 31) <= status < (1 << 31):
        raise ValueError("status must be a signed 32-bit int")
    st.status = status
    return (SOL_RDS, CmsgType.RDS_CMSG_RDMA_STATUS, uapi.to_bytes(st))


def cong_update(mask: int) -> Cmsg:
    return (SOL_RDS, CmsgType.RDS_CMSG_CONG_UPDATE, struct.pack("=Q", _check_u("mask", mask, 64)))


_ATOMIC_KINDS = (
    CmsgType.RDS_CMSG_ATOMIC_FADD,
    CmsgType.RDS_CMSG_ATOMIC_CSWP,
    CmsgType.RDS_CMSG_MASKED_ATOMIC_FADD,
    CmsgType.RDS_CMSG_MASKED_ATOMIC_CSWP,
)


def _atomic(cookie: int, local_addr: int, remote_addr: int, flags: int, user_token: int) -> Any:
    st = uapi.rds_atomic_args()
    st.cookie = _check_u("cookie", cookie, 64)
    st.local_addr = _check_u("local_addr", local_addr, 64)
    st.remote_addr = _check_u("remote_addr", remote_addr, 64)
    st.flags = _check_u("flags", flags, 64)
    st.user_token = _check_u("user_token", user_token, 64)
    return st


def atomic_fadd(
    cookie: int, local_addr: int, remote_addr: int, add: int, flags: int = 0, user_token: int = 0
) -> Cmsg:
    st = _atomic(cookie, local_addr, remote_addr, flags, user_token)
    st.fadd.add = _check_u("add", add, 64)
    return (SOL_RDS, CmsgType.RDS_CMSG_ATOMIC_FADD, uapi.to_bytes(st))


def atomic_cswp(
    cookie: int,
    local_addr: int,
    remote_addr: int,
    compare: int,
    swap: int,
    flags: int = 0,
    user_token: int = 0,
) -> Cmsg:
    st = _atomic(cookie, local_addr, remote_addr, flags, user_token)
    st.cswp.compare = _check_u("compare", compare, 64)
    st.cswp.swap = _check_u("swap", swap, 64)
    return (SOL_RDS, CmsgType.RDS_CMSG_ATOMIC_CSWP, uapi.to_bytes(st))


def masked_atomic_fadd(
    cookie: int,
    local_addr: int,
    remote_addr: int,
    add: int,
    nocarry_mask: int,
    flags: int = 0,
    user_token: int = 0,
) -> Cmsg:
    st = _atomic(cookie, local_addr, remote_addr, flags, user_token)
    st.m_fadd.add = _check_u("add", add, 64)
    st.m_fadd.nocarry_mask = _check_u("nocarry_mask", nocarry_mask, 64)
    return (SOL_RDS, CmsgType.RDS_CMSG_MASKED_ATOMIC_FADD, uapi.to_bytes(st))


def masked_atomic_cswp(
    cookie: int,
    local_addr: int,
    remote_addr: int,
    compare: int,
    swap: int,
    compare_mask: int,
    swap_mask: int,
    flags: int = 0,
    user_token: int = 0,
) -> Cmsg:
    st = _atomic(cookie, local_addr, remote_addr, flags, user_token)
    st.m_cswp.compare = _check_u("compare", compare, 64)
    st.m_cswp.swap = _check_u("swap", swap, 64)
    st.m_cswp.compare_mask = _check_u("compare_mask", compare_mask, 64)
    st.m_cswp.swap_mask = _check_u("swap_mask", swap_mask, 64)
    return (SOL_RDS, CmsgType.RDS_CMSG_MASKED_ATOMIC_CSWP, uapi.to_bytes(st))


def rx_trace(positions: Sequence[int], values: Sequence[int]) -> Cmsg:
    """Build an ``RDS_CMSG_RXPATH_LATENCY`` payload (as delivered by recvmsg)."""
    if len(positions) != len(values) or len(positions) > uapi.RDS_MSG_RX_DGRAM_TRACE_MAX:
        raise ValueError(f"up to {uapi.RDS_MSG_RX_DGRAM_TRACE_MAX} (position, value) pairs")
    st = uapi.rds_cmsg_rx_trace()
    st.rx_traces = len(positions)
    for i, (p, v) in enumerate(zip(positions, values, strict=True)):
        st.rx_trace_pos[i] = _check_u("position", p, 8)
        st.rx_trace[i] = _check_u("value", v, 64)
    return (SOL_RDS, CmsgType.RDS_CMSG_RXPATH_LATENCY, uapi.to_bytes(st))


def rx_trace_so(positions: Sequence[int]) -> bytes:
    """Option value for ``setsockopt(SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, ...)`` (``rds_rx_trace_so``)."""
    if len(positions) > uapi.RDS_MSG_RX_DGRAM_TRACE_MAX:
        raise ValueError(f"at most {uapi.RDS_MSG_RX_DGRAM_TRACE_MAX} positions")
    st = uapi.rds_rx_trace_so()
    st.rx_traces = len(positions)
    for i, p in enumerate(positions):
        st.rx_trace_pos[i] = _check_u("position", p, 8)
    return uapi.to_bytes(st)


def zcopy_cookie(cookie: int) -> Cmsg:
    return (SOL_RDS, CmsgType.RDS_CMSG_ZCOPY_COOKIE, struct.pack("=I", _check_u("cookie", cookie, 32)))


def zcopy_completion(cookies: Sequence[int]) -> Cmsg:
    if len(cookies) > RDS_MAX_ZCOOKIES:
        raise ValueError(f"at most {RDS_MAX_ZCOOKIES} cookies")
    st = uapi.rds_zcopy_cookies()
    st.num = len(cookies)
    for i, c in enumerate(cookies):
        st.cookies[i] = _check_u("cookie", c, 32)
    return (SOL_RDS, CmsgType.RDS_CMSG_ZCOPY_COMPLETION, uapi.to_bytes(st))


def timestamp(sec: int, usec: int) -> Cmsg:
    return (socket.SOL_SOCKET, SO_TIMESTAMP_OLD, struct.pack("=qq", sec, usec))


# ---- parsers


def _need(data: bytes, st: type[ctypes.Structure] | int, what: str) -> None:
    size = st if isinstance(st, int) else ctypes.sizeof(st)
    if len(data) < size:
        raise ValueError(f"{what}: {len(data)} bytes, need {size}")


def parse_cmsg(level: int, ctype: int, data: bytes) -> Any:
    """One ancdata item -> typed object (``UnknownCmsg`` for anything unrecognised)."""
    data = bytes(data)
    if level == socket.SOL_SOCKET and ctype in (SO_TIMESTAMP_OLD, SO_TIMESTAMP_NEW):
        _need(data, 16, "SO_TIMESTAMP")
        sec, usec = struct.unpack_from("=qq", data)
        return Timestamp(sec, usec)
    if level != SOL_RDS:
        return UnknownCmsg(level, ctype, data)
    if ctype == CmsgType.RDS_CMSG_RDMA_ARGS:
        _need(data, uapi.rds_rdma_args, "RDMA_ARGS")
        a = uapi.rds_rdma_args.from_buffer_copy(data)
        return RdmaArgs(
            a.cookie,
            a.remote_vec.addr,
            a.remote_vec.bytes,
            a.local_vec_addr,
            a.nr_local,
            a.flags,
            a.user_token,
        )
    if ctype == CmsgType.RDS_CMSG_RDMA_DEST:
        _need(data, 8, "RDMA_DEST")
        return RdmaDest(struct.unpack_from("=Q", data)[0])
    if ctype == CmsgType.RDS_CMSG_RDMA_MAP:
        _need(data, uapi.rds_get_mr_args, "RDMA_MAP")
        m = uapi.rds_get_mr_args.from_buffer_copy(data)
        return RdmaMap(m.vec.addr, m.vec.bytes, m.cookie_addr, m.flags)
    if ctype == CmsgType.RDS_CMSG_RDMA_STATUS:
        _need(data, uapi.rds_rdma_notify, "RDMA_STATUS")
        n = uapi.rds_rdma_notify.from_buffer_copy(data)
        return RdmaNotify(n.user_token, n.status)
    if ctype == CmsgType.RDS_CMSG_CONG_UPDATE:
        _need(data, 8, "CONG_UPDATE")
        return CongUpdate(struct.unpack_from("=Q", data)[0])
    if ctype in _ATOMIC_KINDS:
        _need(data, uapi.rds_atomic_args, "ATOMIC")
        t = uapi.rds_atomic_args.from_buffer_copy(data)
        kind = CmsgType(ctype)
        common = {"cookie": t.cookie, "local_addr": t.local_addr, "remote_addr": t.remote_addr}
        tail = {"flags": t.flags, "user_token": t.user_token}
        if kind == CmsgType.RDS_CMSG_ATOMIC_FADD:
            return AtomicArgs(kind, **common, add=t.fadd.add, **tail)
        if kind == CmsgType.RDS_CMSG_ATOMIC_CSWP:
            return AtomicArgs(kind, **common, compare=t.cswp.compare, swap=t.cswp.swap, **tail)
        if kind == CmsgType.RDS_CMSG_MASKED_ATOMIC_FADD:
            return AtomicArgs(kind, **common, add=t.m_fadd.add, nocarry_mask=t.m_fadd.nocarry_mask, **tail)
        mc = t.m_cswp
        return AtomicArgs(
            kind,
            **common,
            compare=mc.compare,
            swap=mc.swap,
            compare_mask=mc.compare_mask,
            swap_mask=mc.swap_mask,
            **tail,
        )
    if ctype == CmsgType.RDS_CMSG_RXPATH_LATENCY:
        _need(data, uapi.rds_cmsg_rx_trace, "RXPATH_LATENCY")
        r = uapi.rds_cmsg_rx_trace.from_buffer_copy(data)
        n_tr = min(r.rx_traces, uapi.RDS_MSG_RX_DGRAM_TRACE_MAX)
        return RxTrace(tuple(r.rx_trace_pos[:n_tr]), tuple(r.rx_trace[:n_tr]))
    if ctype == CmsgType.RDS_CMSG_ZCOPY_COOKIE:
        _need(data, 4, "ZCOPY_COOKIE")
        return ZcopyCookie(struct.unpack_from("=I", data)[0])
    if ctype == CmsgType.RDS_CMSG_ZCOPY_COMPLETION:
        _need(data, uapi.rds_zcopy_cookies, "ZCOPY_COMPLETION")
        z = uapi.rds_zcopy_cookies.from_buffer_copy(data)
        return ZcopyCompletion(tuple(z.cookies[: min(z.num, RDS_MAX_ZCOOKIES)]))
    return UnknownCmsg(level, ctype, data)


def parse_ancdata(ancdata: Iterable[tuple[int, int, bytes]]) -> list[Any]:
    """recvmsg ancdata -> list of typed objects, in order."""
    return [parse_cmsg(level, ctype, data) for level, ctype, data in ancdata]


def build(value: Any) -> Cmsg:
    """Typed object -> ``(level, type, bytes)`` (inverse of :func:`parse_cmsg`)."""
    if isinstance(value, RdmaArgs):
        return rdma_args(
            value.cookie,
            value.remote_addr,
            value.remote_bytes,
            value.local_vec_addr,
            value.nr_local,
            value.flags,
            value.user_token,
        )
    if isinstance(value, RdmaDest):
        return rdma_dest(value.cookie)
    if isinstance(value, RdmaMap):
        return rdma_map(value.addr, value.bytes, value.cookie_addr, value.flags)
    if isinstance(value, RdmaNotify):
        return rdma_status(value.user_token, value.status)
    if isinstance(value, CongUpdate):
        return cong_update(value.mask)
    if isinstance(value, AtomicArgs):
        v = value
        if v.kind == CmsgType.RDS_CMSG_ATOMIC_FADD:
            return atomic_fadd(v.cookie, v.local_addr, v.remote_addr, v.add, v.flags, v.user_token)
        if v.kind == CmsgType.RDS_CMSG_ATOMIC_CSWP:
            return atomic_cswp(
                v.cookie, v.local_addr, v.remote_addr, v.compare, v.swap, v.flags, v.user_token
            )
        if v.kind == CmsgType.RDS_CMSG_MASKED_ATOMIC_FADD:
            return masked_atomic_fadd(
                v.cookie, v.local_addr, v.remote_addr, v.add, v.nocarry_mask, v.flags, v.user_token
            )
        if v.kind == CmsgType.RDS_CMSG_MASKED_ATOMIC_CSWP:
            return masked_atomic_cswp(
                v.cookie,
                v.local_addr,
                v.remote_addr,
                v.compare,
                v.swap,
                v.compare_mask,
                v.swap_mask,
                v.flags,
                v.user_token,
            )
        raise ValueError(f"not an atomic cmsg type: {v.kind}")
    if isinstance(value, RxTrace):
        return rx_trace(value.positions, value.values)
    if isinstance(value, ZcopyCookie):
        return zcopy_cookie(value.cookie)
    if isinstance(value, ZcopyCompletion):
        return zcopy_completion(value.cookies)
    if isinstance(value, Timestamp):
        return timestamp(value.sec, value.usec)
    if isinstance(value, UnknownCmsg):
        return (value.level, value.type, value.data)
    raise TypeError(f"cannot build a control message from {type(value).__name__}")


# the cookie helpers, re-exported where RDMA users look for them
rdma_cookie = uapi.rdma_cookie
rdma_cookie_key = uapi.rdma_cookie_key
rdma_cookie_offset = uapi.rdma_cookie_offset

__all__ = [
    "AtomicArgs",
    "CongUpdate",
    "RdmaArgs",
    "RdmaDest",
    "RdmaMap",
    "RdmaNotify",
    "RxTrace",
    "Timestamp",
    "UnknownCmsg",
    "ZcopyCompletion",
    "ZcopyCookie",
    "atomic_cswp",
    "atomic_fadd",
    "build",
    "cong_update",
    "masked_atomic_cswp",
    "masked_atomic_fadd",
    "parse_ancdata",
    "parse_cmsg",
    "rdma_args",
    "rdma_cookie",
    "rdma_cookie_key",
    "rdma_cookie_offset",
    "rdma_dest",
    "rdma_map",
    "rdma_status",
    "rx_trace",
    "rx_trace_so",
    "timestamp",
    "zcopy_completion",
    "zcopy_cookie",
]
