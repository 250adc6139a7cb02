"""Who may do what on this stack (docs/userspace.md, "Trust model").

The service learns each control connection's peer with SO_PEERCRED when it accepts it. A private stack
(``StackConfig.owner`` set) serves its owner's uid only and closes any other connection unread. Stack-wide
writes (sysctl-like settings, forced reconnects) need privilege, as writing /proc/sys/net/rds does: uid 0, or
CAP_NET_ADMIN in the service's user namespace, or, on a private stack, the owner's uid; anyone else gets
EACCES (what an unprivileged ``open(/proc/sys/net/..., O_WRONLY)`` gets). Reads stay open, like RDS_INFO.
"""

from __future__ import annotations

import os

from pyrds.userspace.config import PeerCred

__all__ = ["CAP_NET_ADMIN", "has_cap_net_admin", "may_administer", "may_connect"]

CAP_NET_ADMIN = 12  # include/uapi/linux/capability.h


def may_connect(peer: PeerCred, owner: int | None) -> bool:
    """Whether a stack owned by ``owner`` (None: the shared stack) serves this peer at all."""
    return owner is None or peer.uid == owner


def _same_user_ns(pid: int) -> bool:
    try:
        theirs = os.stat(f"/proc/{pid}/ns/user")
        ours = os.stat("/proc/self/ns/user")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def has_cap_net_admin(peer: PeerCred) -> bool:
    """Whether the peer process holds CAP_NET_ADMIN (CapEff of /proc/<pid>/status) in our user namespace.

    Read at the time of the request: the process must still be the peer (its effective uid must still be
    ``peer.uid``; a recycled pid of another uid does not count), and a capability held only in a child user
    namespace (``unshare -U``) does not count either, as ns_capable(net->user_ns, ...) would not."""
    try:
        with open(f"/proc/{peer.pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        euid = int(fields["Uid"].split()[1])
        cap_eff = int(fields["CapEff"].strip(), 16)
    except (OSError, KeyError, ValueError, IndexError):
        return False
    if euid != peer.uid or not _same_user_ns(peer.pid):
        return False
    return bool(cap_eff >> CAP_NET_ADMIN & 1)


def may_administer(peer: PeerCred | None, owner: int | None) -> bool:
    """Whether this peer may change stack-wide settings (None: an in-process caller, e.g. a test)."""
    if peer is None or peer.uid == 0:
        return True
    if owner is not None and peer.uid == owner:
        return True
    return has_cap_net_admin(peer)
