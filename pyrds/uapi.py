"""ctypes mirrors of every structure of ``include/uapi/linux/rds.h`` (plus the socket address structures).

The layouts follow the header exactly: ``_pack_ = 1`` only on the structures the header marks
``__attribute__((packed))`` (the info records); the RDMA argument structures and ``rds_info_rdma_connection``
use natural alignment. Big-endian (``__be16``/``__be32``) fields are declared with the host integer type and
the raw network-order bytes are kept: use :func:`be16`/:func:`be32` helpers (or :mod:`pyrds.info`) to convert.
``tests/unit/test_uapi_layout.py`` proves every size and offset against the real header with gcc.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct

from pyrds.constants import RDS_MAX_ZCOOKIES, TRANSNAMSIZ

RDS_IB_GID_LEN = 16
RDS_MSG_RX_DGRAM_TRACE_MAX = 3

u8 = ctypes.c_uint8
u16 = ctypes.c_uint16
u32 = ctypes.c_uint32
u64 = ctypes.c_uint64
s32 = ctypes.c_int32

In6Addr = u8 * 16


def be16(value: int) -> int:
    """Convert between host order and the network-order value stored in a ``__be16`` ctypes field."""
    return int(socket.ntohs(value))


def be32(value: int) -> int:
    """Convert between host order and the network-order value stored in a ``__be32`` ctypes field."""
    return int(socket.ntohl(value))


# ---- info


class rds_info_counter(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("name", u8 * 32), ("value", u64)]


class rds_info_connection(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("next_tx_seq", u64),
        ("next_rx_seq", u64),
        ("laddr", u32),
        ("faddr", u32),
        ("transport", u8 * TRANSNAMSIZ),
        ("flags", u8),
        ("tos", u8),
    ]


class rds6_info_connection(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("next_tx_seq", u64),
        ("next_rx_seq", u64),
        ("laddr", In6Addr),
        ("faddr", In6Addr),
        ("transport", u8 * TRANSNAMSIZ),
        ("flags", u8),
    ]


class rds_info_message(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("seq", u64),
        ("len", u32),
        ("laddr", u32),
        ("faddr", u32),
        ("lport", u16),
        ("fport", u16),
        ("flags", u8),
        ("tos", u8),
    ]


class rds6_info_message(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("seq", u64),
        ("len", u32),
        ("laddr", In6Addr),
        ("faddr", In6Addr),
        ("lport", u16),
        ("fport", u16),
        ("flags", u8),
        ("tos", u8),
    ]


class rds_info_socket(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("sndbuf", u32),
        ("bound_addr", u32),
        ("connected_addr", u32),
        ("bound_port", u16),
        ("connected_port", u16),
        ("rcvbuf", u32),
        ("inum", u64),
    ]


class rds6_info_socket(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("sndbuf", u32),
        ("bound_addr", In6Addr),
        ("connected_addr", In6Addr),
        ("bound_port", u16),
        ("connected_port", u16),
        ("rcvbuf", u32),
        ("inum", u64),
    ]


class rds_info_tcp_socket(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("local_addr", u32),
        ("local_port", u16),
        ("peer_addr", u32),
        ("peer_port", u16),
        ("hdr_rem", u64),
        ("data_rem", u64),
        ("last_sent_nxt", u32),
        ("last_expected_una", u32),
        ("last_seen_una", u32),
        ("tos", u8),
    ]


class rds6_info_tcp_socket(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("local_addr", In6Addr),
        ("local_port", u16),
        ("peer_addr", In6Addr),
        ("peer_port", u16),
        ("hdr_rem", u64),
        ("data_rem", u64),
        ("last_sent_nxt", u32),
        ("last_expected_una", u32),
        ("last_seen_una", u32),
    ]


class rds_info_rdma_connection(ctypes.Structure):
    _fields_ = [
        ("src_addr", u32),
        ("dst_addr", u32),
        ("src_gid", u8 * RDS_IB_GID_LEN),
        ("dst_gid", u8 * RDS_IB_GID_LEN),
        ("max_send_wr", u32),
        ("max_recv_wr", u32),
        ("max_send_sge", u32),
        ("rdma_mr_max", u32),
        ("rdma_mr_size", u32),
        ("tos", u8),
        ("sl", u8),
        ("cache_allocs", u32),
    ]


class rds6_info_rdma_connection(ctypes.Structure):
    _fields_ = [
        ("src_addr", In6Addr),
        ("dst_addr", In6Addr),
        ("src_gid", u8 * RDS_IB_GID_LEN),
        ("dst_gid", u8 * RDS_IB_GID_LEN),
        ("max_send_wr", u32),
        ("max_recv_wr", u32),
        ("max_send_sge", u32),
        ("rdma_mr_max", u32),
        ("rdma_mr_size", u32),
        ("tos", u8),
        ("sl", u8),
        ("cache_allocs", u32),
    ]


# ---- rx trace


class rds_rx_trace_so(ctypes.Structure):
    _fields_ = [("rx_traces", u8), ("rx_trace_pos", u8 * RDS_MSG_RX_DGRAM_TRACE_MAX)]


class rds_cmsg_rx_trace(ctypes.Structure):
    _fields_ = [
        ("rx_traces", u8),
        ("rx_trace_pos", u8 * RDS_MSG_RX_DGRAM_TRACE_MAX),
        ("rx_trace", u64 * RDS_MSG_RX_DGRAM_TRACE_MAX),
    ]


# ---- sockaddr


class sockaddr(ctypes.Structure):
    _fields_ = [("sa_family", u16), ("sa_data", ctypes.c_char * 14)]


class in_addr(ctypes.Structure):
    _fields_ = [("s_addr", u32)]


class sockaddr_in(ctypes.Structure):
    _fields_ = [("sin_family", u16), ("sin_port", u16), ("sin_addr", in_addr), ("sin_zero", u8 * 8)]


class sockaddr_in6(ctypes.Structure):
    _fields_ = [
        ("sin6_family", u16),
        ("sin6_port", u16),
        ("sin6_flowinfo", u32),
        ("sin6_addr", In6Addr),
        ("sin6_scope_id", u32),
    ]


class sockaddr_storage(ctypes.Structure):
    """``struct __kernel_sockaddr_storage``: 128 bytes, aligned like a pointer."""

    _fields_ = [("ss_family", u16), ("__data", ctypes.c_char * 118), ("__align", ctypes.c_void_p)]


def make_sockaddr_in(host: str, port: int) -> sockaddr_in:
    sa = sockaddr_in()
    sa.sin_family = socket.AF_INET
    sa.sin_port = socket.htons(port)
    sa.sin_addr.s_addr = struct.unpack("=I", socket.inet_pton(socket.AF_INET, host))[0]
    return sa


def make_sockaddr_in6(host: str, port: int, flowinfo: int = 0, scope_id: int = 0) -> sockaddr_in6:
    sa = sockaddr_in6()
    sa.sin6_family = socket.AF_INET6
    sa.sin6_port = socket.htons(port)
    sa.sin6_flowinfo = socket.htonl(flowinfo)
    ctypes.memmove(sa.sin6_addr, socket.inet_pton(socket.AF_INET6, host), 16)
    sa.sin6_scope_id = scope_id
    return sa


def make_sockaddr_storage(host: str, port: int, flowinfo: int = 0, scope_id: int = 0) -> sockaddr_storage:
    """A ``sockaddr_storage`` holding an IPv4 or IPv6 address (as in ``rds_get_mr_for_dest_args``)."""
    ss = sockaddr_storage()
    src: sockaddr_in | sockaddr_in6
    if ipaddress.ip_address(host).version == 6:
        src = make_sockaddr_in6(host, port, flowinfo, scope_id)
    else:
        src = make_sockaddr_in(host, port)
    ctypes.memmove(ctypes.addressof(ss), ctypes.addressof(src), ctypes.sizeof(src))
    return ss


def parse_sockaddr(raw: bytes) -> tuple[str, int] | tuple[str, int, int, int]:
    """Decode a ``sockaddr_in``/``sockaddr_in6`` (as returned by getsockname/recvmsg) to an address tuple."""
    if len(raw) < 2:
        raise ValueError("sockaddr too short")
    family = struct.unpack_from("=H", raw)[0]
    if family == socket.AF_INET:
        if len(raw) < 8:
            raise ValueError("sockaddr_in too short")
        port = struct.unpack_from("!H", raw, 2)[0]
        return (socket.inet_ntop(socket.AF_INET, raw[4:8]), port)
    if family == socket.AF_INET6:
        if len(raw) < 28:
            raise ValueError("sockaddr_in6 too short")
        port, flowinfo = struct.unpack_from("!HI", raw, 2)
        scope_id = struct.unpack_from("=I", raw, 24)[0]
        return (socket.inet_ntop(socket.AF_INET6, raw[8:24]), port, flowinfo, scope_id)
    raise ValueError(f"unsupported address family {family}")


# ---- rdma


class rds_iovec(ctypes.Structure):
    _fields_ = [("addr", u64), ("bytes", u64)]


class rds_get_mr_args(ctypes.Structure):
    _fields_ = [("vec", rds_iovec), ("cookie_addr", u64), ("flags", u64)]


class rds_get_mr_for_dest_args(ctypes.Structure):
    _fields_ = [("dest_addr", sockaddr_storage), ("vec", rds_iovec), ("cookie_addr", u64), ("flags", u64)]


class rds_free_mr_args(ctypes.Structure):
    _fields_ = [("cookie", u64), ("flags", u64)]


class rds_rdma_args(ctypes.Structure):
    _fields_ = [
        ("cookie", u64),
        ("remote_vec", rds_iovec),
        ("local_vec_addr", u64),
        ("nr_local", u64),
        ("flags", u64),
        ("user_token", u64),
    ]


class _atomic_cswp(ctypes.Structure):
    _fields_ = [("compare", u64), ("swap", u64)]


class _atomic_fadd(ctypes.Structure):
    _fields_ = [("add", u64)]


class _atomic_m_cswp(ctypes.Structure):
    _fields_ = [("compare", u64), ("swap", u64), ("compare_mask", u64), ("swap_mask", u64)]


class _atomic_m_fadd(ctypes.Structure):
    _fields_ = [("add", u64), ("nocarry_mask", u64)]


class _atomic_union(ctypes.Union):
    _fields_ = [
        ("cswp", _atomic_cswp),
        ("fadd", _atomic_fadd),
        ("m_cswp", _atomic_m_cswp),
        ("m_fadd", _atomic_m_fadd),
    ]


class rds_atomic_args(ctypes.Structure):
    """``struct rds_atomic_args``; anonymous union members: ``cswp``, ``fadd``, ``m_cswp``, ``m_fadd``."""

    _anonymous_ = ("u",)
    _fields_ = [
        ("cookie", u64),
        ("local_addr", u64),
        ("remote_addr", u64),
        ("u", _atomic_union),
        ("flags", u64),
        ("user_token", u64),
    ]


class rds_rdma_notify(ctypes.Structure):
    _fields_ = [("user_token", u64), ("status", s32)]


class rds_zcopy_cookies(ctypes.Structure):
    _fields_ = [("num", u32), ("cookies", u32 * RDS_MAX_ZCOOKIES)]


class timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


# Every UAPI structure: name in linux/rds.h -> ctypes class (the layout test walks this table).
UAPI_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "rds_info_counter": rds_info_counter,
    "rds_info_connection": rds_info_connection,
    "rds6_info_connection": rds6_info_connection,
    "rds_info_message": rds_info_message,
    "rds6_info_message": rds6_info_message,
    "rds_info_socket": rds_info_socket,
    "rds6_info_socket": rds6_info_socket,
    "rds_info_tcp_socket": rds_info_tcp_socket,
    "rds6_info_tcp_socket": rds6_info_tcp_socket,
    "rds_info_rdma_connection": rds_info_rdma_connection,
    "rds6_info_rdma_connection": rds6_info_rdma_connection,
    "rds_rx_trace_so": rds_rx_trace_so,
    "rds_cmsg_rx_trace": rds_cmsg_rx_trace,
    "rds_iovec": rds_iovec,
    "rds_get_mr_args": rds_get_mr_args,
    "rds_get_mr_for_dest_args": rds_get_mr_for_dest_args,
    "rds_free_mr_args": rds_free_mr_args,
    "rds_rdma_args": rds_rdma_args,
    "rds_atomic_args": rds_atomic_args,
    "rds_rdma_notify": rds_rdma_notify,
    "rds_zcopy_cookies": rds_zcopy_cookies,
}


def rdma_cookie(r_key: int, offset: int = 0) -> int:
    """``rds_rdma_make_cookie``: ``r_key | offset << 32``."""
    if not 0 <= r_key <= 0xFFFFFFFF or not 0 <= offset <= 0xFFFFFFFF:
        raise ValueError("r_key and offset must be 32-bit unsigned")
    return r_key | (offset << 32)


def rdma_cookie_key(cookie: int) -> int:
    return cookie & 0xFFFFFFFF


def rdma_cookie_offset(cookie: int) -> int:
    return (cookie >> 32) & 0xFFFFFFFF


def to_bytes(obj: ctypes.Structure | ctypes.Union) -> bytes:
    return ctypes.string_at(ctypes.addressof(obj), ctypes.sizeof(obj))
