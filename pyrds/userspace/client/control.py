"""Stack-wide control of this namespace's userspace stack, without an RDS socket: sysctl-like settings.

``sysctl_get()`` / ``sysctl_set(name, value)`` mirror /proc/sys/net/rds (ping_enable, reconnect_min_delay_ms,
reconnect_max_delay_ms, ...) and /proc/sys/net/rds/tcp (rds_tcp_sndbuf, rds_tcp_rcvbuf). ``force_reconnect()``
is the equivalent of rewriting net.rds.tcp.rds_tcp_sndbuf: every RDS/TCP connection is dropped, the owners
reconnect and retransmit what was not acked. ``stack_counters(sock)`` reads every counter of the stack serving
``sock``, the userspace-only ones included.
"""

from __future__ import annotations

import errno
from typing import Any

from pyrds import info
from pyrds.api import os_error
from pyrds.constants import PYRDS_INFO_STACK_COUNTERS, SOL_RDS, InfoType
from pyrds.userspace import rpc
from pyrds.userspace.client.autostart import connect_stack

__all__ = ["force_reconnect", "stack_counters", "sysctl_get", "sysctl_set"]


def _call(op: int, args: Any) -> Any:
    ctl = connect_stack()
    try:
        code, result, _fds = rpc.request(ctl, op, args)
    finally:
        ctl.close()
    if code:
        raise os_error(code if code != rpc.WAIT_CONG else errno.EAGAIN)
    return result


def sysctl_get() -> dict[str, int]:
    values: dict[str, int] = _call(rpc.Op.SYSCTL_GET, ())
    return values


def sysctl_set(name: str, value: int) -> None:
    """ENOENT for an unknown name; EACCES without privilege (uid 0, CAP_NET_ADMIN or the private stack's
    owner), as for an unprivileged write to /proc/sys/net/rds. ``force_reconnect`` needs the same."""
    _call(rpc.Op.SYSCTL_SET, (str(name), int(value)))


def force_reconnect() -> None:
    sysctl_set("rds_tcp_sndbuf", sysctl_get()["rds_tcp_sndbuf"])


def stack_counters(sock: Any) -> dict[str, int]:
    """Every counter of the userspace stack serving ``sock`` (a ``pyrds.userspace.RDSSocket``), including the
    userspace-only ones (:data:`pyrds.userspace.stack.counters.EXTRA_NAMES`)."""
    raw = sock.getsockopt(SOL_RDS, PYRDS_INFO_STACK_COUNTERS, 1 << 20)
    return info.counters_dict(info.parse_info(InfoType.RDS_INFO_COUNTERS, raw))
