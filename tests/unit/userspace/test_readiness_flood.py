"""A local user flooding the readiness pair's listener (issue 8: "Flooding the loopback readiness listener
stalled the service and switched every later socket to the AF_UNIX fallback, whose poll mask then included
POLLWRBAND")."""

from __future__ import annotations

import os
import socket

from pyrds.userspace.service import readiness


def _own_loopback_listeners() -> list[int]:
    """Ports of this process's TCP sockets listening on 127.0.0.1 (/proc/net/tcp matched to our fds)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if state == "0A" and local.startswith("0100007F:") and inode in inodes:
                ports.append(int(local.split(":")[1], 16))
    return ports


def test_no_listener_left_to_flood_and_pairs_stay_tcp() -> None:
    first = readiness.Readiness()
    flood: list[socket.socket] = []
    try:
        assert first.tcp, "this host's loopback should give a TCP readiness pair"
        for port in _own_loopback_listeners():  # what a flooder finds: fill every backlog we left open
            for _ in range(200):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                flood.append(s)
        # on a flooded listener a pair times out (2 s, the service stalled) and falls back to AF_UNIX for good
        later = [readiness.Readiness() for _ in range(5)]
        try:
            assert all(r.tcp for r in later), "a later pair fell back to AF_UNIX (POLLWRBAND in its mask)"
        finally:
            for r in later:
                r.close()
    finally:
        for s in flood:
            s.close()
        first.close()
