"""Control messages: sendmsg cmsg validation (send.c) and recvmsg cmsg output (recv.c)."""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections.abc import Callable, Sequence

from pyrds import cmsg as builders
from pyrds.constants import MSG_ZEROCOPY, SOL_RDS, CmsgType
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.sockstate import Incoming, SockState

_HDR = 16  # sizeof(struct cmsghdr) on 64-bit
RDMA_ARGS_SIZE = 56
ATOMIC_ARGS_SIZE = 72
ATOMICS = (
    CmsgType.RDS_CMSG_ATOMIC_FADD,
    CmsgType.RDS_CMSG_ATOMIC_CSWP,
    CmsgType.RDS_CMSG_MASKED_ATOMIC_FADD,
    CmsgType.RDS_CMSG_MASKED_ATOMIC_CSWP,
)


def scan_cmsgs(
    anc: Sequence[tuple[int, int, bytes]], flags: int, on_rdma_args: Callable[[bytes], None] | None = None
) -> bool:
    """``rds_rm_size``'s walk over a sendmsg's SOL_RDS cmsgs, shared by every transport.

    Unknown types, a short RDMA_ARGS, MSG_ZEROCOPY without a cookie, and RDMA/atomic ops mixed with a
    cookie, MAP or DEST are EINVAL (:class:`StackError`). ``on_rdma_args`` sees each RDMA_ARGS payload in
    order (an RDMA transport sizes its vectors there, so its errors come where the kernel's do). Returns
    whether any RDMA or atomic cmsg was present.
    """
    groups = 0
    has_cookie = False
    any_rdma = False
    for level, kind, data in anc:
        if level != SOL_RDS:
            continue
        if kind == CmsgType.RDS_CMSG_RDMA_ARGS:
            if len(data) < RDMA_ARGS_SIZE:
                raise StackError(errno.EINVAL)
            groups |= 1
            any_rdma = True
            if on_rdma_args is not None:
                on_rdma_args(data)
        elif kind == CmsgType.RDS_CMSG_ZCOPY_COOKIE:
            has_cookie = True
            groups |= 2
        elif kind in (CmsgType.RDS_CMSG_RDMA_DEST, CmsgType.RDS_CMSG_RDMA_MAP):
            groups |= 2
            any_rdma = True
        elif kind in ATOMICS:
            groups |= 1
            any_rdma = True
        else:
            raise StackError(errno.EINVAL)
    if flags & MSG_ZEROCOPY and not has_cookie:
        raise StackError(errno.EINVAL)
    if groups == 3:
        raise StackError(errno.EINVAL)
    return any_rdma


def check_send(anc: Sequence[tuple[int, int, bytes]], flags: int, zcopy: bool) -> int | None:
    """rds_rdma_bytes + rds_rm_size + rds_cmsg_send for a transport without RDMA (TCP/loop).

    Returns the zerocopy cookie (or None); raises :class:`StackError` with the kernel's errno.
    """
    # DEST and MAP raise below before an RDMA op could count, so "any RDMA" here means ARGS or an atomic
    rdma_or_atomic = scan_cmsgs(anc, flags)
    cookie: int | None = None
    for level, kind, data in anc:
        if level != SOL_RDS:
            continue
        if kind == CmsgType.RDS_CMSG_RDMA_DEST:
            raise StackError(errno.EINVAL)  # no MR with that r_key can exist without an RDMA transport
        if kind == CmsgType.RDS_CMSG_RDMA_MAP:
            raise StackError(errno.EOPNOTSUPP)  # rds_get_mr: transport has no get_mr
        if kind in ATOMICS:
            if len(data) < ATOMIC_ARGS_SIZE:
                raise StackError(errno.EINVAL)
            rdma_or_atomic = True
        if kind == CmsgType.RDS_CMSG_ZCOPY_COOKIE:
            if len(data) < 4 or not zcopy:
                raise StackError(errno.EINVAL)
            cookie = struct.unpack_from("=I", data)[0]
    if rdma_or_atomic:
        raise StackError(errno.EOPNOTSUPP)
    return cookie


def _space(n: int) -> int:
    return socket.CMSG_SPACE(n)


class AncBuilder:
    """put_cmsg into a control buffer of ``size`` bytes (truncation sets MSG_CTRUNC like the kernel)."""

    def __init__(self, size: int) -> None:
        self.space = size
        self.items: list[tuple[int, int, bytes]] = []
        self.msg_flags = 0

    def put(self, level: int, kind: int, data: bytes) -> bool:
        if self.space < _HDR:
            self.msg_flags |= int(socket.MSG_CTRUNC)
            return True  # the kernel returns 0: the notification counts as delivered
        cmlen = _HDR + len(data)
        if self.space < cmlen:
            self.msg_flags |= int(socket.MSG_CTRUNC)
            data = data[: self.space - _HDR]
        self.items.append((int(level), int(kind), bytes(data)))
        self.space -= min(_space(len(data)), self.space)
        return True

    def put_cong(self, mask: int) -> bool:
        return self.put(*builders.cong_update(mask))

    def put_rdma_status(self, token: int, status: int) -> None:
        self.put(*builders.rdma_status(token, status))

    def put_recv(self, rs: SockState, inc: Incoming) -> None:
        """rds_cmsg_recv: the RDMA destination cookie, timestamp and rx path latency."""
        if inc.rdma_cookie:
            self.put(*builders.rdma_dest(inc.rdma_cookie))
        if inc.rx_tstamp_ns and rs.timestamp:
            sec, ns = divmod(inc.rx_tstamp_ns, 1_000_000_000)
            self.put(*builders.timestamp(sec, ns // 1000))
        if rs.rx_traces:
            lat = (*inc.lat[:3], time.monotonic_ns())
            vals = [max(0, lat[j + 1] - lat[j]) for j in rs.rx_traces]
            self.put(*builders.rx_trace(list(rs.rx_traces), vals))

    def put_zcookies(self, rs: SockState) -> bool:
        """rds_recvmsg_zcookie: one completion entry, only when it fits whole."""
        if not rs.zerocopy or not rs.zcookies or self.space < _space(36):
            return False
        cookies = rs.zcookies.popleft()
        self.put(*builders.zcopy_completion(cookies))
        return True
