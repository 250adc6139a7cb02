"""The RDS port space of one stack: (address, port) -> socket, with the kernel's bind rules (bind.c)."""

from __future__ import annotations

import errno
import ipaddress
import random
import socket

from pyrds.addr import IPAddress
from pyrds.constants import RDS_FLAG_PROBE_PORT

Key = tuple[IPAddress, int]


def normalize(ip: IPAddress) -> IPAddress:
    """v4-mapped IPv6 addresses are the IPv4 address (the kernel keys everything as in6)."""
    if type(ip) is ipaddress.IPv4Address:  # the usual case, several times per message: no property call
        return ip
    if ip.version == 6:
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return mapped
    return ip


def is_loopback(ip: IPAddress) -> bool:
    """rds_trans_get_preferred: 127/8 and ::1 always use the loop transport."""
    return normalize(ip).is_loopback


def is_local(ip: IPAddress, scope_id: int = 0) -> bool:
    """True when ``ip`` is an address of this network namespace (a UDP bind succeeds)."""
    ip = normalize(ip)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            if family == socket.AF_INET6:
                probe.bind((str(ip), 0, 0, scope_id))
            else:
                probe.bind((str(ip), 0))
        except OSError:
            return False
    return True


class PortSpace:
    """Bound (addr, port) pairs of one stack; values are socket ids."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._bound: dict[Key, int] = {}
        self._rng = rng or random.Random()
        #: the last :meth:`lookup`: its address object, port and answer (forgotten by every change of
        #: ``_bound``; a transport delivers to one address object per connection: no hashing then)
        self._last: tuple[IPAddress, int, int | None] | None = None

    def lookup(self, ip: IPAddress, port: int) -> int | None:
        last = self._last
        if last is not None and last[0] is ip and last[1] == port:
            return last[2]
        found = self._bound.get((normalize(ip), port))
        self._last = (ip, port, found)
        return found

    def add(self, ip: IPAddress, port: int, sock_id: int) -> int:
        """rds_add_bound: bind ``port`` (0 = pick one >= 2 from a random start); port or -errno."""
        ip = normalize(ip)
        if port == RDS_FLAG_PROBE_PORT:
            return -errno.EINVAL
        if port:
            if (ip, port) in self._bound:
                return -errno.EADDRINUSE
            self._bound[(ip, port)] = sock_id
            self._last = None
            return port
        rover = max(self._rng.randrange(0, 1 << 16), 2)
        for _ in range(1 << 16):
            if rover > 0xFFFF:
                rover = 2
            if rover >= 2 and (ip, rover) not in self._bound:
                self._bound[(ip, rover)] = sock_id
                self._last = None
                return rover
            rover += 1
        return -errno.EADDRINUSE

    def remove(self, ip: IPAddress, port: int, sock_id: int) -> None:
        key = (normalize(ip), port)
        if self._bound.get(key) == sock_id:
            del self._bound[key]
            self._last = None

    def __len__(self) -> int:
        return len(self._bound)


ANY4 = ipaddress.IPv4Address(0)
