"""Typed RDS_INFO records: one frozen dataclass per table, decoded from / encoded to the kernel's layout.

``parse_info(info_type, raw)`` turns the bytes returned by ``getsockopt(SOL_RDS, RDS_INFO_*)`` into records;
``encode_info(info_type, records)`` gives byte-identical kernel output (the userspace backend answers RDS_INFO
with it). Addresses are :mod:`ipaddress` objects, ports are host-order ints, transport names are ``str``.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from pyrds import uapi
from pyrds.constants import TRANSNAMSIZ, InfoConnectionFlag, InfoMessageFlag, InfoType


@dataclass(frozen=True, slots=True)
class InfoCounter:
    """One ``rds_info_counter`` (RDS_INFO_COUNTERS): a named statistics counter."""

    name: str
    value: int


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """``rds_info_connection`` (RDS_INFO_CONNECTIONS)."""

    next_tx_seq: int
    next_rx_seq: int
    laddr: ipaddress.IPv4Address
    faddr: ipaddress.IPv4Address
    transport: str
    flags: InfoConnectionFlag
    tos: int


@dataclass(frozen=True, slots=True)
class Connection6Info:
    """``rds6_info_connection`` (RDS6_INFO_CONNECTIONS; no tos in the v6 record)."""

    next_tx_seq: int
    next_rx_seq: int
    laddr: ipaddress.IPv6Address
    faddr: ipaddress.IPv6Address
    transport: str
    flags: InfoConnectionFlag


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """``rds_info_message`` (RDS_INFO_SEND_MESSAGES / RETRANS_MESSAGES / RECV_MESSAGES)."""

    seq: int
    len: int
    laddr: ipaddress.IPv4Address
    faddr: ipaddress.IPv4Address
    lport: int
    fport: int
    flags: InfoMessageFlag
    tos: int


@dataclass(frozen=True, slots=True)
class Message6Info:
    """``rds6_info_message`` (RDS6_INFO_SEND/RETRANS/RECV_MESSAGES)."""

    seq: int
    len: int
    laddr: ipaddress.IPv6Address
    faddr: ipaddress.IPv6Address
    lport: int
    fport: int
    flags: InfoMessageFlag
    tos: int


@dataclass(frozen=True, slots=True)
class SocketInfo:
    """``rds_info_socket`` (RDS_INFO_SOCKETS)."""

    sndbuf: int
    bound_addr: ipaddress.IPv4Address
    connected_addr: ipaddress.IPv4Address
    bound_port: int
    connected_port: int
    rcvbuf: int
    inum: int


@dataclass(frozen=True, slots=True)
class Socket6Info:
    """``rds6_info_socket`` (RDS6_INFO_SOCKETS)."""

    sndbuf: int
    bound_addr: ipaddress.IPv6Address
    connected_addr: ipaddress.IPv6Address
    bound_port: int
    connected_port: int
    rcvbuf: int
    inum: int


@dataclass(frozen=True, slots=True)
class TcpSocketInfo:
    """``rds_info_tcp_socket`` (RDS_INFO_TCP_SOCKETS)."""

    local_addr: ipaddress.IPv4Address
    local_port: int
    peer_addr: ipaddress.IPv4Address
    peer_port: int
    hdr_rem: int
    data_rem: int
    last_sent_nxt: int
    last_expected_una: int
    last_seen_una: int
    tos: int


@dataclass(frozen=True, slots=True)
class TcpSocket6Info:
    """``rds6_info_tcp_socket`` (RDS6_INFO_TCP_SOCKETS; no tos in the v6 record)."""

    local_addr: ipaddress.IPv6Address
    local_port: int
    peer_addr: ipaddress.IPv6Address
    peer_port: int
    hdr_rem: int
    data_rem: int
    last_sent_nxt: int
    last_expected_una: int
    last_seen_una: int


@dataclass(frozen=True, slots=True)
class RdmaConnectionInfo:
    """``rds_info_rdma_connection`` (RDS_INFO_IB_CONNECTIONS / RDS_INFO_IWARP_CONNECTIONS)."""

    src_addr: ipaddress.IPv4Address
    dst_addr: ipaddress.IPv4Address
    src_gid: bytes
    dst_gid: bytes
    max_send_wr: int
    max_recv_wr: int
    max_send_sge: int
    rdma_mr_max: int
    rdma_mr_size: int
    tos: int
    sl: int
    cache_allocs: int


@dataclass(frozen=True, slots=True)
class RdmaConnection6Info:
    """``rds6_info_rdma_connection`` (RDS6_INFO_IB_CONNECTIONS)."""

    src_addr: ipaddress.IPv6Address
    dst_addr: ipaddress.IPv6Address
    src_gid: bytes
    dst_gid: bytes
    max_send_wr: int
    max_recv_wr: int
    max_send_sge: int
    rdma_mr_max: int
    rdma_mr_size: int
    tos: int
    sl: int
    cache_allocs: int


InfoRecord = (
    InfoCounter
    | ConnectionInfo
    | Connection6Info
    | MessageInfo
    | Message6Info
    | SocketInfo
    | Socket6Info
    | TcpSocketInfo
    | TcpSocket6Info
    | RdmaConnectionInfo
    | RdmaConnection6Info
)

# info type -> (record class, ctypes struct)
TABLES: dict[InfoType, tuple[type[Any], type[ctypes.Structure]]] = {
    InfoType.RDS_INFO_COUNTERS: (InfoCounter, uapi.rds_info_counter),
    InfoType.RDS_INFO_CONNECTIONS: (ConnectionInfo, uapi.rds_info_connection),
    InfoType.RDS_INFO_SEND_MESSAGES: (MessageInfo, uapi.rds_info_message),
    InfoType.RDS_INFO_RETRANS_MESSAGES: (MessageInfo, uapi.rds_info_message),
    InfoType.RDS_INFO_RECV_MESSAGES: (MessageInfo, uapi.rds_info_message),
    InfoType.RDS_INFO_SOCKETS: (SocketInfo, uapi.rds_info_socket),
    InfoType.RDS_INFO_TCP_SOCKETS: (TcpSocketInfo, uapi.rds_info_tcp_socket),
    InfoType.RDS_INFO_IB_CONNECTIONS: (RdmaConnectionInfo, uapi.rds_info_rdma_connection),
    InfoType.RDS_INFO_IWARP_CONNECTIONS: (RdmaConnectionInfo, uapi.rds_info_rdma_connection),
    InfoType.RDS6_INFO_CONNECTIONS: (Connection6Info, uapi.rds6_info_connection),
    InfoType.RDS6_INFO_SEND_MESSAGES: (Message6Info, uapi.rds6_info_message),
    InfoType.RDS6_INFO_RETRANS_MESSAGES: (Message6Info, uapi.rds6_info_message),
    InfoType.RDS6_INFO_RECV_MESSAGES: (Message6Info, uapi.rds6_info_message),
    InfoType.RDS6_INFO_SOCKETS: (Socket6Info, uapi.rds6_info_socket),
    InfoType.RDS6_INFO_TCP_SOCKETS: (TcpSocket6Info, uapi.rds6_info_tcp_socket),
    InfoType.RDS6_INFO_IB_CONNECTIONS: (RdmaConnection6Info, uapi.rds6_info_rdma_connection),
}

_PORT_FIELDS = frozenset({"lport", "fport", "bound_port", "connected_port", "local_port", "peer_port"})
_IP4_FIELDS = frozenset(
    {"laddr", "faddr", "bound_addr", "connected_addr", "local_addr", "peer_addr", "src_addr", "dst_addr"}
)
_STR_FIELDS = frozenset({"name", "transport"})


def _table(info_type: int) -> tuple[type[Any], type[ctypes.Structure]]:
    try:
        return TABLES[InfoType(info_type)]
    except (ValueError, KeyError):
        raise ValueError(f"no record format for RDS info type {info_type!r}") from None


def record_size(info_type: int) -> int:
    """Size of one record of ``info_type`` in the kernel's layout (what a successful getsockopt returns)."""
    return ctypes.sizeof(_table(info_type)[1])


def record_class(info_type: int) -> type[Any]:
    return _table(info_type)[0]


def _decode_field(name: str, raw: Any, is_v6: bool, rec_cls: type[Any]) -> Any:
    if name in _STR_FIELDS:
        data = bytes(raw)
        return data.split(b"\0", 1)[0].decode("ascii", "replace")
    if name in _PORT_FIELDS:
        return socket.ntohs(raw)
    if name in _IP4_FIELDS:
        if is_v6:
            return ipaddress.IPv6Address(bytes(raw))
        return ipaddress.IPv4Address(struct.pack("=I", raw))
    if name in ("src_gid", "dst_gid"):
        return bytes(raw)
    if name == "flags":
        if rec_cls in (ConnectionInfo, Connection6Info):
            return InfoConnectionFlag(raw)
        return InfoMessageFlag(raw)
    return int(raw)


def _encode_field(st: ctypes.Structure, name: str, value: Any, is_v6: bool) -> None:
    if name in _STR_FIELDS:
        data = value.encode("ascii") if isinstance(value, str) else bytes(value)
        arr = getattr(st, name)
        size = ctypes.sizeof(arr)
        if len(data) >= size and name == "transport":
            raise ValueError(f"transport name longer than {TRANSNAMSIZ - 1} bytes")
        if len(data) > size:
            raise ValueError(f"{name} longer than {size} bytes")
        ctypes.memmove(arr, data, len(data))
    elif name in _PORT_FIELDS:
        setattr(st, name, socket.htons(int(value)))
    elif name in _IP4_FIELDS:
        ip = ipaddress.ip_address(value)
        if is_v6:
            if ip.version != 6:
                ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
            ctypes.memmove(getattr(st, name), ip.packed, 16)
        else:
            if ip.version != 4:
                raise ValueError(f"{name}: IPv4 address needed, got {ip}")
            setattr(st, name, struct.unpack("=I", ip.packed)[0])
    elif name in ("src_gid", "dst_gid"):
        data = bytes(value)
        if len(data) != uapi.RDS_IB_GID_LEN:
            raise ValueError(f"{name} must be {uapi.RDS_IB_GID_LEN} bytes")
        ctypes.memmove(getattr(st, name), data, len(data))
    else:
        setattr(st, name, int(value))


def _is_v6(st_cls: type[ctypes.Structure]) -> bool:
    return st_cls.__name__.startswith("rds6_")


def parse_info(info_type: int, raw: bytes | bytearray | memoryview) -> list[Any]:
    """Decode an RDS_INFO buffer (``len(raw)`` must be a multiple of the record size)."""
    rec_cls, st_cls = _table(info_type)
    size = ctypes.sizeof(st_cls)
    data = bytes(raw)
    if len(data) % size:
        raise ValueError(f"{len(data)} bytes is not a multiple of the {size}-byte {st_cls.__name__}")
    v6 = _is_v6(st_cls)
    names = [f.name for f in fields(rec_cls)]
    out: list[Any] = []
    for off in range(0, len(data), size):
        st = st_cls.from_buffer_copy(data, off)
        out.append(rec_cls(**{n: _decode_field(n, getattr(st, n), v6, rec_cls) for n in names}))
    return out


def encode_record(info_type: int, record: Any) -> bytes:
    rec_cls, st_cls = _table(info_type)
    if not isinstance(record, rec_cls):
        raise TypeError(
            f"info type {info_type} needs {rec_cls.__name__} records, not {type(record).__name__}"
        )
    st = st_cls()
    v6 = _is_v6(st_cls)
    for f in fields(rec_cls):
        _encode_field(st, f.name, getattr(record, f.name), v6)
    return uapi.to_bytes(st)


def encode_info(info_type: int, records: Iterable[Any]) -> bytes:
    """The kernel's bytes for ``records`` (concatenated packed structures)."""
    return b"".join(encode_record(info_type, r) for r in records)


def counters_dict(records: Sequence[InfoCounter]) -> dict[str, int]:
    """COUNTERS records as ``{name: value}``."""
    return {r.name: r.value for r in records}
