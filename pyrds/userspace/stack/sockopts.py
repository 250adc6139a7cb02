"""setsockopt/getsockopt/TOS of the userspace stack (af_rds.c, sock.c) with the kernel's errno."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

from pyrds.constants import (
    PYRDS_INFO_STACK_COUNTERS,
    RDS_INFO_FIRST,
    RDS_INFO_LAST,
    SO_RCVBUFFORCE,
    SO_SNDBUFFORCE,
    SO_TIMESTAMP_NEW,
    SO_TIMESTAMP_OLD,
    SO_ZEROCOPY,
    SOL_RDS,
    SockOpt,
    Transport,
)
from pyrds.userspace.config import SOCK_MIN_RCVBUF, SOCK_MIN_SNDBUF
from pyrds.userspace.stack import info_tables, rdma
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.sockstate import SockState

INT_MAX = (1 << 31) - 1
GET_MR_ARGS_SIZE = 32
GET_MR_FOR_DEST_ARGS_SIZE = 160
FREE_MR_ARGS_SIZE = 16
_GENERIC_SOL_SOCKET = {
    socket.SO_DEBUG,
    socket.SO_REUSEADDR,
    socket.SO_KEEPALIVE,
    socket.SO_DONTROUTE,
    socket.SO_BROADCAST,
    socket.SO_PRIORITY,
    socket.SO_OOBINLINE,
    socket.SO_REUSEPORT,
    socket.SO_RCVLOWAT,
    socket.SO_SNDLOWAT,
}


def _int(value: int | bytes) -> int:
    if isinstance(value, int):
        return value
    if len(value) < 4:
        raise StackError(errno.EINVAL)
    v: int = struct.unpack_from("=i", value)[0]
    return v


def _sockaddr(value: int | bytes) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """A sockaddr_in / sockaddr_in6 option value (rds_cancel_sent_to)."""
    if isinstance(value, int) or len(value) < 16:
        raise StackError(errno.EINVAL)
    port = struct.unpack_from("!H", value, 2)[0]
    if len(value) < 28:
        return ipaddress.IPv4Address(value[4:8]), port
    return ipaddress.IPv6Address(value[8:24]), port


def setsockopt(
    stack: Stack, rs: SockState, level: int, optname: int, value: int | bytes, net_admin: bool = True
) -> None:
    """``net_admin``: the caller holds CAP_NET_ADMIN; without it SO_SNDBUFFORCE/SO_RCVBUFFORCE are EPERM
    (sock_setsockopt: ``sockopt_capable(CAP_NET_ADMIN)``, after reading the int value)."""
    cfg = stack.config
    stack.revoke_posts(rs)  # a grant was made for the options as they were (the send buffer, ...)
    if level == socket.SOL_SOCKET:
        val = _int(value)
        if optname in (SO_SNDBUFFORCE, SO_RCVBUFFORCE) and not net_admin:
            raise StackError(errno.EPERM)
        if optname in (socket.SO_SNDBUF, SO_SNDBUFFORCE):
            if optname == socket.SO_SNDBUF:
                val = min(val & 0xFFFFFFFF, cfg.wmem_max)
            rs.sndbuf = max(min(val, INT_MAX // 2) * 2, SOCK_MIN_SNDBUF)
        elif optname in (socket.SO_RCVBUF, SO_RCVBUFFORCE):
            if optname == socket.SO_RCVBUF:
                val = min(val & 0xFFFFFFFF, cfg.rmem_max)
            rs.rcvbuf = max(min(val, INT_MAX // 2) * 2, SOCK_MIN_RCVBUF)
        elif optname in (SO_TIMESTAMP_OLD, SO_TIMESTAMP_NEW):
            rs.timestamp = bool(val)
        elif optname == SO_ZEROCOPY:
            if val < 0 or val > 1:
                raise StackError(errno.EINVAL)
            rs.zerocopy = bool(val)
        elif optname not in _GENERIC_SOL_SOCKET:
            raise StackError(errno.ENOPROTOOPT)
        rs.update_readiness()
        return
    if level != SOL_RDS:
        raise StackError(errno.ENOPROTOOPT)
    if optname == SockOpt.RDS_CANCEL_SENT_TO:
        if rs.bound_addr is None:
            raise StackError(errno.ENOTCONN)
        addr, port = _sockaddr(value)
        stack.cancel_sent_to(rs, addr, port)
    elif optname in (SockOpt.RDS_GET_MR, SockOpt.RDS_GET_MR_FOR_DEST):
        # rds_get_mr / rds_get_mr_for_dest: exact optlen, then __rds_rdma_map: unbound, no get_mr
        size = GET_MR_ARGS_SIZE if optname == SockOpt.RDS_GET_MR else GET_MR_FOR_DEST_ARGS_SIZE
        if isinstance(value, int) or len(value) != size:
            raise StackError(errno.EINVAL)
        if rs.bound_addr is None:
            raise StackError(errno.ENOTCONN)
        if stack.rdma_transport(rs) is None:
            raise StackError(errno.EOPNOTSUPP)
        # RDS/IB: __rds_rdma_map's checks and its pin, then rds_ib_reg_frmr without a connection (a socket
        # option has none to post the registration on): EOPNOTSUPP, as a kernel with an FRWR device (rxe,
        # every current HCA) answers; MRs come from RDS_CMSG_RDMA_MAP
        addr, nbytes = struct.unpack_from("=QQ", value, 0 if optname == SockOpt.RDS_GET_MR else 128)
        npages = rdma.map_checks(addr, nbytes)
        stack.memory_of(rs).read(addr & ~(rdma.PAGE - 1), npages * rdma.PAGE)
        raise StackError(errno.EOPNOTSUPP)
    elif optname == SockOpt.RDS_FREE_MR:
        # rds_free_mr: exact optlen; cookie 0 flushes the transport's MRs (TCP/loop have no flush_mrs:
        # EINVAL); otherwise the socket's MR of that r_key is freed, or EINVAL
        if isinstance(value, int) or len(value) != FREE_MR_ARGS_SIZE:
            raise StackError(errno.EINVAL)
        cookie, _flags = struct.unpack("=QQ", value)
        if cookie == 0:
            if rs.transport != Transport.IB or stack.transport_of(Transport.IB) is None:
                raise StackError(errno.EINVAL)
            return
        if rdma.drop_mr(rs.mrs, cookie & 0xFFFFFFFF) is None:
            raise StackError(errno.EINVAL)
    elif optname == SockOpt.RDS_RECVERR:
        rs.recverr = bool(_int(value))
    elif optname == SockOpt.RDS_CONG_MONITOR:
        stack.cong.monitor(rs, bool(_int(value)))
        rs.update_readiness()
    elif optname == SockOpt.SO_RDS_TRANSPORT:
        if rs.transport is not None:
            raise StackError(errno.EOPNOTSUPP)
        if isinstance(value, bytes) and len(value) != 4:
            raise StackError(errno.EINVAL)
        t = _int(value)
        if t < 0 or t >= 3:
            raise StackError(errno.EINVAL)
        if t != Transport.TCP and not stack.config.initial_netns:
            raise StackError(errno.EPROTOTYPE)  # 7.3: RDS/IB only in the initial network namespace
        if t != Transport.TCP and (t != Transport.IB or stack.transport_of(Transport.IB) is None):
            raise StackError(errno.ENOPROTOOPT)  # rds_trans_get: no such transport (no IWARP; IB if attached)
        rs.transport = Transport(t)
    elif optname in (SO_TIMESTAMP_OLD, SO_TIMESTAMP_NEW):
        rs.timestamp = bool(_int(value))
    elif optname == SockOpt.SO_RDS_MSG_RXPATH_LATENCY:
        if isinstance(value, int) or len(value) != 4:
            raise StackError(errno.EFAULT)
        n = value[0]
        if n > 3 or any(p >= 3 for p in value[1 : 1 + n]):
            rs.rx_traces = ()
            raise StackError(errno.EFAULT)
        rs.rx_traces = tuple(value[1 : 1 + n])
    else:
        raise StackError(errno.ENOPROTOOPT)


def getsockopt(stack: Stack, rs: SockState, level: int, optname: int, buflen: int) -> int | bytes:
    """Returns an int for int options when ``buflen`` is 0, else bytes (like the stdlib)."""
    want = buflen if buflen else 4
    if level == socket.SOL_SOCKET:
        table = {
            socket.SO_SNDBUF: rs.sndbuf,
            socket.SO_RCVBUF: rs.rcvbuf,
            SO_TIMESTAMP_OLD: int(rs.timestamp),
            SO_ZEROCOPY: int(rs.zerocopy),
            socket.SO_TYPE: socket.SOCK_SEQPACKET,
            socket.SO_ERROR: 0,
            socket.SO_DOMAIN: 21,
            socket.SO_PROTOCOL: 0,
        }
        if optname not in table:
            raise StackError(errno.ENOPROTOOPT)
        return _ret(table[optname], buflen)
    if level != SOL_RDS:
        raise StackError(errno.ENOPROTOOPT)
    if RDS_INFO_FIRST <= optname <= RDS_INFO_LAST or optname == PYRDS_INFO_STACK_COUNTERS:
        raw, each = info_tables.table_bytes(stack, optname, buflen)
        if len(raw) > buflen:
            raise StackError(errno.ENOSPC, len(raw))
        return raw
    if optname == SockOpt.RDS_RECVERR:
        if want < 4:
            raise StackError(errno.EINVAL)
        return _ret(int(rs.recverr), buflen)
    if optname == SockOpt.SO_RDS_TRANSPORT:
        if want < 4:
            raise StackError(errno.EINVAL)
        return _ret(int(rs.transport) if rs.transport is not None else -1, buflen)
    raise StackError(errno.ENOPROTOOPT)


def _ret(value: int, buflen: int) -> int | bytes:
    if buflen:
        return struct.pack("=i", value)[: min(buflen, 4)]
    return int(value)


def set_tos(rs: SockState, tos: int) -> None:
    """SIOCRDSSETTOS: loop/unbound -> ENOTTY (no get_tos_map); TCP maps every tos to 0; EINVAL once used."""
    if rs.transport != Transport.TCP:
        raise StackError(errno.ENOTTY)
    if rs.tos or rs.sent_any:
        raise StackError(errno.EINVAL)
    rs.tos = 0
