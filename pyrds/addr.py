"""Address handling shared by both backends.

RDS addresses look like the stdlib's: ``(host, port)`` for IPv4 and ``(host, port, flowinfo, scope_id)`` for
IPv6 (a 2-tuple with an IPv6 host is accepted). Validation raises TypeError/ValueError, never OSError, so
that bad Python arguments are refused before any system call.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SockAddr = tuple[str, int] | tuple[str, int, int, int]


@dataclass(frozen=True, slots=True)
class RDSAddress:
    """A parsed RDS socket address."""

    ip: IPAddress
    port: int
    flowinfo: int = 0
    scope_id: int = 0

    @property
    def family(self) -> int:
        return socket.AF_INET6 if self.ip.version == 6 else socket.AF_INET

    def to_tuple(self) -> SockAddr:
        if self.ip.version == 6:
            return (str(self.ip), self.port, self.flowinfo, self.scope_id)
        return (str(self.ip), self.port)

    @property
    def is_any(self) -> bool:
        return self.ip.is_unspecified

    def is_bcast_or_mcast(self) -> bool:
        if self.ip.is_multicast:
            return True
        return self.ip.version == 4 and int(self.ip) == 0xFFFFFFFF


def parse_address(address: Any) -> RDSAddress:
    """Parse a user-supplied address tuple; TypeError/ValueError on malformed input."""
    if not isinstance(address, tuple):
        raise TypeError(
            f"RDS address must be a tuple (host, port[, flowinfo, scope_id]), not {type(address).__name__}"
        )
    if len(address) not in (2, 4):
        raise TypeError("RDS address must be (host, port) or (host, port, flowinfo, scope_id)")
    host, port = address[0], address[1]
    if not isinstance(host, str):
        raise TypeError(f"host must be str, not {type(host).__name__}")
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"port must be int, not {type(port).__name__}")
    if not 0 <= port <= 0xFFFF:
        raise OverflowError("port must be 0-65535.")
    try:
        ip: IPAddress = ipaddress.ip_address(host if host else "0.0.0.0")
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(host))
        except OSError as exc:
            raise ValueError(f"cannot resolve RDS host {host!r}: {exc}") from None
    flowinfo = scope_id = 0
    if len(address) == 4:
        flowinfo, scope_id = address[2], address[3]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (flowinfo, scope_id)):
            raise TypeError("flowinfo and scope_id must be int")
        if ip.version == 4:
            raise ValueError("a 4-tuple address needs an IPv6 host")
        if not 0 <= flowinfo <= 0xFFFFF:
            raise OverflowError("flowinfo must be 0-1048575.")
        if not 0 <= scope_id <= 0xFFFFFFFF:
            raise OverflowError("scope_id must be 0-4294967295.")
    return RDSAddress(ip, port, flowinfo, scope_id)


def format_address(ip: IPAddress, port: int, scope_id: int = 0) -> SockAddr:
    """The tuple returned to users for an address (4-tuple for IPv6)."""
    if ip.version == 6:
        return (str(ip), port, 0, scope_id)
    return (str(ip), port)
