"""How long the userspace stack takes to drop a socket's queued messages (``rds_send_drop_to``).

An in-process :class:`~pyrds.userspace.stack.core.Stack` with the RDS/TCP transport (a fake event loop: no
service, nothing ever connects) sends ``N`` one-byte messages from one socket to addresses nobody answers
(documentation addresses, not on this host: every dial fails to bind and backs off), then times:

- ``close``: closing the socket (``rds_release``) with all ``N`` queued to one address;
- ``close-2dest``: the same with the messages alternating between two addresses;
- ``cancel-half``: RDS_CANCEL_SENT_TO for one of the two addresses (half of the ``N``).

Usage (the pyrds it imports is the one on PYTHONPATH, so a checkout can be compared with another one):
``env PYTHONPATH=CHECKOUT python benchmarks/cancel_close.py [N ...]`` (default: 20000 100000).
"""

from __future__ import annotations

import ipaddress
import sys
import time
from collections.abc import Callable
from typing import Any

from pyrds.addr import IPAddress
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.ports import normalize
from pyrds.userspace.stack.sockstate import SockState
from pyrds.userspace.transports import loop_transport
from pyrds.userspace.transports.tcp.transport import TcpTransport

SRC = ipaddress.ip_address("198.51.100.1")
DESTS = (ipaddress.ip_address("198.51.100.2"), ipaddress.ip_address("198.51.100.3"))
DPORT = 4000


class _NoLoop:
    """The event loop as the transport sees it; nothing ever runs."""

    def register(self, *_a: Any) -> None: ...
    def modify(self, *_a: Any) -> None: ...
    def unregister(self, *_a: Any) -> None: ...
    def call_later(self, *_a: Any) -> None: ...


def _stack() -> Stack:
    stack = Stack()

    def is_local(ip: IPAddress, scope_id: int = 0) -> bool:
        return normalize(ip) == SRC

    stack.is_local = is_local  # type: ignore[method-assign]
    stack.attach(loop_transport(stack))
    stack.attach(TcpTransport(stack, _NoLoop()))
    return stack


def _socket_with_queued(stack: Stack, count: int, dests: tuple[IPAddress, ...]) -> SockState:
    rs = stack.open()
    rs.sndbuf = max(rs.sndbuf, 4 * count)  # rds_sndbuf is half of it: room for every message
    stack.bind(rs, SRC, 0, 0)
    for i in range(count):
        stack.sendmsg(rs, b"x", [], 0, (dests[i % len(dests)], DPORT), True)
    assert len(rs.sent) == count
    return rs


def _timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def measure(count: int) -> dict[str, float]:
    times: dict[str, float] = {}
    stack = _stack()
    rs = _socket_with_queued(stack, count, DESTS[:1])
    times["close"] = _timed(lambda: stack.close(rs))
    stack = _stack()
    rs = _socket_with_queued(stack, count, DESTS)
    times["close-2dest"] = _timed(lambda: stack.close(rs))
    stack = _stack()
    rs = _socket_with_queued(stack, count, DESTS)
    times["cancel-half"] = _timed(lambda: stack.cancel_sent_to(rs, DESTS[0], DPORT))
    assert len(rs.sent) == count - (count + 1) // 2
    return times


def main(argv: list[str]) -> int:
    counts = [int(a) for a in argv] or [20000, 100000]
    for count in counts:
        row = "  ".join(f"{name} {secs:8.3f} s" for name, secs in measure(count).items())
        print(f"N={count:>7}  {row}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
