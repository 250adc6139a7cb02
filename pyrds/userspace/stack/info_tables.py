"""RDS_INFO tables of the userspace stack, built as :mod:`pyrds.info` records (info.c, connection.c, ...)."""

from __future__ import annotations

import errno
import ipaddress
from typing import Any

from pyrds import info
from pyrds.addr import IPAddress
from pyrds.constants import PYRDS_INFO_STACK_COUNTERS, InfoConnectionFlag, InfoMessageFlag, InfoType
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.counters import info_counters
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.transport import RdmaTransport

_ANY4 = ipaddress.IPv4Address(0)
_ANY6 = ipaddress.IPv6Address(0)
_SUPPORTED = {
    InfoType.RDS_INFO_COUNTERS,
    InfoType.RDS_INFO_CONNECTIONS,
    InfoType.RDS_INFO_SEND_MESSAGES,
    InfoType.RDS_INFO_RETRANS_MESSAGES,
    InfoType.RDS_INFO_RECV_MESSAGES,
    InfoType.RDS_INFO_SOCKETS,
    InfoType.RDS_INFO_TCP_SOCKETS,
    InfoType.RDS6_INFO_CONNECTIONS,
    InfoType.RDS6_INFO_SEND_MESSAGES,
    InfoType.RDS6_INFO_RETRANS_MESSAGES,
    InfoType.RDS6_INFO_RECV_MESSAGES,
    InfoType.RDS6_INFO_SOCKETS,
    InfoType.RDS6_INFO_TCP_SOCKETS,
}
#: answered only while an RDMA transport is attached (rds_rdma registers them: ib.c ``rds_ib_init``)
_RDMA = {InfoType.RDS_INFO_IB_CONNECTIONS, InfoType.RDS6_INFO_IB_CONNECTIONS}
_V6 = {t for t in InfoType if t.name.startswith("RDS6_")}
_NO_GID = bytes(16)


def _v6(ip: IPAddress | None) -> ipaddress.IPv6Address:
    if ip is None:
        return _ANY6
    if ip.version == 6:
        return ip
    return ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)


def _v4(ip: IPAddress) -> ipaddress.IPv4Address:
    return ip if isinstance(ip, ipaddress.IPv4Address) else _ANY4


_NOFLAG = InfoMessageFlag(0)


def _rdma(stack: Stack) -> RdmaTransport | None:
    for t in stack.transports:
        if isinstance(t, RdmaTransport):
            return t
    return None


def _all_counters(stack: Stack, rdma: RdmaTransport | None) -> dict[str, int]:
    out = dict(stack.counters)
    if rdma is not None:
        for k, v in rdma.stat_counters().items():
            out[k] = out.get(k, 0) + v
    return out


def records(stack: Stack, info_type: int) -> list[Any]:
    rdma = _rdma(stack)
    if info_type == PYRDS_INFO_STACK_COUNTERS:
        return [info.InfoCounter(k, v) for k, v in _all_counters(stack, rdma).items()]
    if info_type not in _SUPPORTED and (info_type not in _RDMA or rdma is None):
        raise StackError(errno.ENOPROTOOPT)  # no handler (a kernel without rds_rdma for the IB tables)
    t = InfoType(info_type)
    v6 = t in _V6
    if t == InfoType.RDS_INFO_COUNTERS:
        stats = dict(rdma.stat_counters()) if rdma is not None else None
        return [info.InfoCounter(k, v) for k, v in info_counters(stack.counters, stats)]
    if t in _RDMA:
        assert rdma is not None
        return _rdma_records(rdma, v6)
    if t in (InfoType.RDS_INFO_SOCKETS, InfoType.RDS6_INFO_SOCKETS):
        out: list[Any] = []
        for rs in stack.socks.values():
            if not v6:
                if rs.bound_addr is None or rs.bound_addr.version != 4:
                    continue
                conn = rs.conn_addr if rs.conn_addr is not None and rs.conn_addr.version == 4 else _ANY4
                out.append(
                    info.SocketInfo(
                        rs.rds_sndbuf,
                        rs.bound_addr,
                        conn,
                        rs.bound_port,
                        rs.conn_port,
                        rs.rds_rcvbuf,
                        rs.inum,
                    )
                )
            else:
                out.append(
                    info.Socket6Info(
                        rs.rds_sndbuf,
                        _v6(rs.bound_addr),
                        _v6(rs.conn_addr),
                        rs.bound_port,
                        rs.conn_port,
                        rs.rds_rcvbuf,
                        rs.inum,
                    )
                )
        return out
    if t in (InfoType.RDS_INFO_RECV_MESSAGES, InfoType.RDS6_INFO_RECV_MESSAGES):
        out = []
        for rs in stack.socks.values():
            for inc in rs.recv_queue:
                if not v6 and inc.saddr.version != 4:
                    continue
                args = (inc.seq, len(inc.payload))
                if v6:
                    out.append(
                        info.Message6Info(
                            *args, _v6(inc.daddr), _v6(inc.saddr), inc.dport, inc.sport, _NOFLAG, inc.tos
                        )
                    )
                else:
                    out.append(
                        info.MessageInfo(
                            *args, _v4(inc.daddr), _v4(inc.saddr), inc.dport, inc.sport, _NOFLAG, inc.tos
                        )
                    )
        return out
    if t in (InfoType.RDS_INFO_CONNECTIONS, InfoType.RDS6_INFO_CONNECTIONS):
        rows = [row for t in stack.transports for row in t.info_connections()]
        out = []
        for tx, rx, la, fa, name, flags, tos in rows:
            if v6:
                out.append(info.Connection6Info(tx, rx, _v6(la), _v6(fa), name, InfoConnectionFlag(flags)))
            elif la.version == 4:
                out.append(
                    info.ConnectionInfo(tx, rx, _v4(la), _v4(fa), name, InfoConnectionFlag(flags), tos)
                )
        return out
    if t in (
        InfoType.RDS_INFO_SEND_MESSAGES,
        InfoType.RDS6_INFO_SEND_MESSAGES,
        InfoType.RDS_INFO_RETRANS_MESSAGES,
        InfoType.RDS6_INFO_RETRANS_MESSAGES,
    ):
        retransmit_only = "RETRANS" in t.name
        out = []
        msgs = [row for tr in stack.transports for row in tr.info_messages(retransmit_only)]
        for seq, length, la, fa, lp, fp, tos in msgs:
            if v6:
                out.append(info.Message6Info(seq, length, _v6(la), _v6(fa), lp, fp, _NOFLAG, tos))
            elif la.version == 4:
                # as the kernel: its IPv4 send and retransmit tables give every message laddr and faddr
                # 0.0.0.0 (6.1.0-57, 6.12.118, 7.3.4; RDS/TCP and RDS/IB; 2026-12-04: docs/kernel-vs-facts.md
                # row 22); the RDS6 tables above carry the addresses
                out.append(info.MessageInfo(seq, length, _ANY4, _ANY4, lp, fp, _NOFLAG, tos))
        return out
    # TCP sockets
    out = []
    socks = [row for tr in stack.transports for row in tr.info_tcp_sockets()]
    for la, lp, pa, pp, hdr_rem, data_rem, nxt, una_exp, una in socks:
        if v6:
            out.append(info.TcpSocket6Info(_v6(la), lp, _v6(pa), pp, hdr_rem, data_rem, nxt, una_exp, una))
        elif la.version == 4:
            out.append(info.TcpSocketInfo(_v4(la), lp, _v4(pa), pp, hdr_rem, data_rem, nxt, una_exp, una, 0))
    return out


def _rdma_records(rdma: RdmaTransport, v6: bool) -> list[Any]:
    """ib.c ``rds_ib_conn_info_visitor`` (IPv4 connections only) / ``rds6_ib_conn_info_visitor`` (every
    connection, IPv4 ones v4-mapped)."""
    out: list[Any] = []
    for row in rdma.info_rdma_connections():
        src_gid = row.src_gid if len(row.src_gid) == 16 else _NO_GID
        dst_gid = row.dst_gid if len(row.dst_gid) == 16 else _NO_GID
        rest = (
            src_gid,
            dst_gid,
            row.max_send_wr,
            row.max_recv_wr,
            row.max_send_sge,
            row.rdma_mr_max,
            row.rdma_mr_size,
            row.tos,
            row.sl,
            row.cache_allocs,
        )
        if v6:
            out.append(info.RdmaConnection6Info(_v6(row.laddr), _v6(row.faddr), *rest))
        elif row.laddr.version == 4:
            out.append(info.RdmaConnectionInfo(_v4(row.laddr), _v4(row.faddr), *rest))
    return out


def table_bytes(stack: Stack, info_type: int, buflen: int) -> tuple[bytes, int]:
    """(bytes, record size). The caller raises ENOSPC when ``len(bytes) > buflen`` (rds_info_getsockopt)."""
    recs = records(stack, info_type)
    if info_type == PYRDS_INFO_STACK_COUNTERS:
        info_type = InfoType.RDS_INFO_COUNTERS
    each = info.record_size(info_type)
    raw = info.encode_info(info_type, recs)
    if info_type == InfoType.RDS_INFO_SOCKETS and buflen < len(stack.socks) * each:
        return b"\0" * (len(stack.socks) * each), each  # the kernel sizes the v4 table by every socket
    return raw, each
