"""pyrds.info: records round-trip through the kernel's byte layout."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from pyrds import info, uapi
from pyrds.constants import InfoConnectionFlag, InfoMessageFlag, InfoType

V4A, V4B = ipaddress.IPv4Address("10.0.0.1"), ipaddress.IPv4Address("10.0.0.2")
V6A, V6B = ipaddress.IPv6Address("fd00::1"), ipaddress.IPv6Address("fd00::2")
GID = bytes(range(16))

SAMPLES: dict[InfoType, list[object]] = {
    InfoType.RDS_INFO_COUNTERS: [info.InfoCounter("conn_reset", 3), info.InfoCounter("recv_queued", 1 << 40)],
    InfoType.RDS_INFO_CONNECTIONS: [
        info.ConnectionInfo(5, 7, V4A, V4B, "tcp", InfoConnectionFlag.CONNECTED, 0),
        info.ConnectionInfo(1, 1, V4A, V4A, "loop", InfoConnectionFlag(0), 3),
    ],
    InfoType.RDS6_INFO_CONNECTIONS: [
        info.Connection6Info(2, 3, V6A, V6B, "infiniband", InfoConnectionFlag(6))
    ],
    InfoType.RDS_INFO_SEND_MESSAGES: [info.MessageInfo(9, 100, V4A, V4B, 4000, 4001, InfoMessageFlag(0), 1)],
    InfoType.RDS_INFO_RETRANS_MESSAGES: [info.MessageInfo(9, 0, V4A, V4B, 1, 0, InfoMessageFlag.ACK, 0)],
    InfoType.RDS_INFO_RECV_MESSAGES: [
        info.MessageInfo(1, 1 << 20, V4B, V4A, 65535, 2, InfoMessageFlag(3), 255)
    ],
    InfoType.RDS6_INFO_SEND_MESSAGES: [
        info.Message6Info(9, 100, V6A, V6B, 4000, 4001, InfoMessageFlag(0), 0)
    ],
    InfoType.RDS6_INFO_RETRANS_MESSAGES: [info.Message6Info(1, 2, V6A, V6B, 3, 4, InfoMessageFlag(2), 5)],
    InfoType.RDS6_INFO_RECV_MESSAGES: [],
    InfoType.RDS_INFO_SOCKETS: [
        info.SocketInfo(106496, V4A, ipaddress.IPv4Address(0), 4000, 0, 212992, 12345)
    ],
    InfoType.RDS6_INFO_SOCKETS: [info.Socket6Info(1, V6A, V6B, 1, 2, 3, 1 << 63)],
    InfoType.RDS_INFO_TCP_SOCKETS: [info.TcpSocketInfo(V4A, 16385, V4B, 40000, 1, 2, 3, 4, 5, 6)],
    InfoType.RDS6_INFO_TCP_SOCKETS: [info.TcpSocket6Info(V6A, 16385, V6B, 40000, 1, 2, 3, 4, 0xFFFFFFFF)],
    InfoType.RDS_INFO_IB_CONNECTIONS: [
        info.RdmaConnectionInfo(V4A, V4B, GID, GID[::-1], 1, 2, 3, 4, 5, 6, 7, 8)
    ],
    InfoType.RDS_INFO_IWARP_CONNECTIONS: [],
    InfoType.RDS6_INFO_IB_CONNECTIONS: [info.RdmaConnection6Info(V6A, V6B, GID, GID, 1, 2, 3, 4, 5, 6, 7, 8)],
}


@pytest.mark.parametrize("info_type", sorted(SAMPLES))
def test_roundtrip(info_type: InfoType) -> None:
    records = SAMPLES[info_type]
    raw = info.encode_info(info_type, records)
    assert len(raw) == len(records) * info.record_size(info_type)
    assert info.parse_info(info_type, raw) == records
    assert info.encode_info(info_type, info.parse_info(info_type, raw)) == raw


def test_every_table_with_a_format() -> None:
    for t in InfoType:
        if t == InfoType.RDS_INFO_CONNECTION_STATS:
            with pytest.raises(ValueError):
                info.record_size(t)
        else:
            assert t in SAMPLES


def test_sizes() -> None:
    assert info.record_size(InfoType.RDS_INFO_COUNTERS) == 40
    assert info.record_size(InfoType.RDS_INFO_CONNECTIONS) == 42
    assert info.record_size(InfoType.RDS_INFO_SEND_MESSAGES) == 26
    assert info.record_size(InfoType.RDS_INFO_SOCKETS) == 28
    assert info.record_size(InfoType.RDS_INFO_TCP_SOCKETS) == 41
    assert info.record_size(InfoType.RDS_INFO_IB_CONNECTIONS) == 68
    assert info.record_size(InfoType.RDS6_INFO_CONNECTIONS) == 65


def test_byte_layout_is_network_order() -> None:
    raw = info.encode_info(InfoType.RDS_INFO_SEND_MESSAGES, SAMPLES[InfoType.RDS_INFO_SEND_MESSAGES])
    seq, length, laddr, faddr, lport, fport, flags, tos = struct.unpack("=QI4s4s2s2sBB", raw)
    assert (seq, length) == (9, 100)
    assert laddr == V4A.packed and faddr == V4B.packed
    assert lport == (4000).to_bytes(2, "big") and fport == (4001).to_bytes(2, "big")
    assert (flags, tos) == (0, 1)


def test_counter_names() -> None:
    raw = b"abc" + b"\0" * 29 + struct.pack("=Q", 7)
    assert info.parse_info(InfoType.RDS_INFO_COUNTERS, raw) == [info.InfoCounter("abc", 7)]
    assert info.counters_dict(info.parse_info(InfoType.RDS_INFO_COUNTERS, raw)) == {"abc": 7}


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        info.parse_info(InfoType.RDS_INFO_SOCKETS, b"\0" * 27)
    with pytest.raises(ValueError):
        info.parse_info(12345, b"")
    with pytest.raises(TypeError):
        info.encode_info(InfoType.RDS_INFO_SOCKETS, [info.InfoCounter("x", 1)])
    with pytest.raises(ValueError):
        info.encode_info(
            InfoType.RDS_INFO_CONNECTIONS,
            [info.ConnectionInfo(0, 0, V4A, V4B, "x" * 16, InfoConnectionFlag(0), 0)],
        )
    with pytest.raises(ValueError):
        info.encode_info(
            InfoType.RDS_INFO_SOCKETS,
            [info.SocketInfo(0, V6A, V4A, 0, 0, 0, 0)],  # type: ignore[arg-type]
        )


def test_gid_size_matches() -> None:
    assert uapi.RDS_IB_GID_LEN == 16
