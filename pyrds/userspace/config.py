"""Configuration of the userspace stack: environment, sysctl-like settings, kernel-like buffer defaults."""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from pyrds.constants import RDS_RECONNECT_MAX_DELAY_MS, RDS_RECONNECT_MIN_DELAY_MS, RDS_TCP_PORT

#: the control protocol's version: bumped with every change of its records or shared page, so a client never
#: talks to a running service of another format (v8: PUSH_HDR's tail byte holds flags, PUSH_BYTE_FOLLOWS;
#: v7: the report page; v6: SEND's mode byte holds bits, SEND_WAITED; v5: SEND_REP grew a post grant; v4:
#: received messages pushed to a data channel; v3: the values encoding replaced marshal).
#: tests/unit/userspace/test_wire_version.py pins it to a fingerprint of rpc.py's formats.
DEFAULT_STACK_NAME = "pyrds-stack-v8"
SOCK_MIN_SNDBUF = 4608  # 2 * (2048 + sizeof(struct sk_buff)) on x86_64
SOCK_MIN_RCVBUF = 2304

#: sysctl-like settings readable/writable through the service (names as /proc/sys/net/rds)
SYSCTL_DEFAULTS: dict[str, int] = {
    "ping_enable": 1,
    "reconnect_min_delay_ms": RDS_RECONNECT_MIN_DELAY_MS,
    "reconnect_max_delay_ms": RDS_RECONNECT_MAX_DELAY_MS,
    "max_unacked_packets": 8,
    "max_unacked_bytes": 16 << 20,
    # /proc/sys/net/rds/tcp: SO_SNDBUF/SO_RCVBUF of RDS/TCP sockets (0 = kernel default); writing either one
    # drops every RDS/TCP connection of the stack (rds_tcp_skbuf_handler)
    "rds_tcp_sndbuf": 0,
    "rds_tcp_rcvbuf": 0,
    # pyrds only (the kernels set none): TCP_USER_TIMEOUT of RDS/TCP sockets, so a connection whose data
    # or keepalive probes go unanswered this long is dropped and re-dialled instead of retransmitting for
    # tcp_retries2 (~15 min); 0 = TCP's default. Applies to connections made after a change.
    "rds_tcp_user_timeout_ms": 30_000,
}
#: the settings whose value must be in 0 .. 2**31 - 1 (EINVAL otherwise)
SYSCTL_NON_NEGATIVE = frozenset({"rds_tcp_user_timeout_ms"})


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return int(raw)


def _proc_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


NET_NS_INIT_INO = 0xEFFFFFF9  # inode of the initial network namespace since 6.18 (include/uapi/linux/nsfs.h)


def _fixed_init_ns_inodes() -> bool:
    """Whether this kernel gives the initial namespaces fixed inode numbers (6.18 and later)."""
    try:
        major, minor = (int(v) for v in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 18)


def in_initial_netns() -> bool:
    """Whether the calling thread is in the initial network namespace (``net_eq(net, &init_net)``).

    6.18+ number it :data:`NET_NS_INIT_INO`; older kernels are compared with pid 1's namespace (when that
    cannot be read, the answer is True: the 6.1 behaviour)."""
    try:
        own = os.stat("/proc/thread-self/ns/net")
    except OSError:
        return True
    if own.st_ino == NET_NS_INIT_INO or _fixed_init_ns_inodes():
        return own.st_ino == NET_NS_INIT_INO
    try:
        init = os.stat("/proc/1/ns/net")
    except OSError:
        return True
    return (own.st_dev, own.st_ino) == (init.st_dev, init.st_ino)


def stack_name() -> str:
    """Abstract unix socket name (without the leading NUL); PYRDS_STACK_NAME overrides it (tests)."""
    return os.environ.get("PYRDS_STACK_NAME") or DEFAULT_STACK_NAME


def stack_address(name: str | None = None) -> bytes:
    return b"\0" + (name or stack_name()).encode()


# -- trust (docs/userspace.md, "Trust model"): the shared stack's name is served by uid 0 only; a user whose
# process finds no root service gets a private stack, serving that uid only, under a name derived from it.


def private_stack_name(uid: int, base: str | None = None) -> str:
    """The abstract name of uid's private stack: the shared name + ``-uid<N>``."""
    return f"{base or stack_name()}-uid{int(uid)}"


def default_owner() -> int | None:
    """Whom a service started by this process serves: None (everyone: the shared stack) for euid 0, else the
    effective uid (a private stack)."""
    euid = os.geteuid()
    return None if euid == 0 else euid


class PeerCred(NamedTuple):
    """SO_PEERCRED of a unix socket: the peer's pid, effective uid and gid at connect()/listen() time."""

    pid: int
    uid: int
    gid: int


_UCRED = struct.Struct("3i")


def peer_cred(sock: socket.socket) -> PeerCred:
    """The peer's credentials as the kernel recorded them (uids mapped into our user namespace)."""
    return PeerCred(*_UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)))


@dataclass
class StackConfig:
    """Settings of one stack (one per network namespace)."""

    name: str = field(default_factory=stack_name)
    #: None: the shared stack (served by root, to every uid); a uid: that uid's private stack
    owner: int | None = field(default_factory=default_owner)
    tcp_port: int = field(default_factory=lambda: _env_int("PYRDS_TCP_PORT", RDS_TCP_PORT))
    tcp_peer_port: int = field(default_factory=lambda: _env_int("PYRDS_TCP_PEER_PORT", RDS_TCP_PORT))
    #: seconds the service lingers after its last client left (when idle); <0 means run forever
    idle_exit: float = field(default_factory=lambda: float(os.environ.get("PYRDS_IDLE_EXIT", "5")))
    wmem_default: int = field(default_factory=lambda: _proc_int("/proc/sys/net/core/wmem_default", 212992))
    rmem_default: int = field(default_factory=lambda: _proc_int("/proc/sys/net/core/rmem_default", 212992))
    wmem_max: int = field(default_factory=lambda: _proc_int("/proc/sys/net/core/wmem_max", 212992))
    rmem_max: int = field(default_factory=lambda: _proc_int("/proc/sys/net/core/rmem_max", 212992))
    sysctl: dict[str, int] = field(default_factory=lambda: dict(SYSCTL_DEFAULTS))
    #: the stack serves the initial network namespace (7.3: SO_RDS_TRANSPORT IB/IWARP elsewhere is EPROTOTYPE)
    initial_netns: bool = field(default_factory=in_initial_netns)

    @property
    def served_name(self) -> str:
        """The abstract name this stack listens on: :attr:`name`, or its private form for :attr:`owner`."""
        return self.name if self.owner is None else private_stack_name(self.owner, self.name)

    def set_sysctl(self, name: str, value: int) -> None:
        if name not in self.sysctl:
            raise KeyError(name)
        self.sysctl[name] = int(value)
