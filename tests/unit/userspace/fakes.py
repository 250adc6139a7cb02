"""Shared pieces of the userspace transport tests: a fake event loop and two namespaces joined by a veth."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytest


class NullTransport:
    """A network transport (``stack.transport.Transport``) that does nothing and holds nothing; tests override
    what they watch (``transmit``, ``cancel``, ...)."""

    prefer_loopback = True
    immediate = False

    def start(self) -> None: ...
    def transmit(self, msg: Any, hash_key: Any) -> None: ...
    def cork(self) -> None: ...
    def uncork(self) -> None: ...
    def cancel(self, msgs: Sequence[Any]) -> None: ...
    def cong_map_changed(self, laddr: Any) -> None: ...
    def reset(self) -> None: ...

    def busy(self) -> bool:
        return False

    def close(self) -> None: ...

    def info_connections(self) -> Iterable[Any]:
        return []

    def info_messages(self, retransmit_only: bool) -> Iterable[Any]:
        return []

    def info_tcp_sockets(self) -> Iterable[Any]:
        return []


class FakeSvc:
    """The service's event loop as a transport sees it: registrations are ignored, timers are collected and
    run on demand (:meth:`run_timers`)."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def register(self, *_a: Any) -> None: ...
    def modify(self, *_a: Any) -> None: ...
    def unregister(self, *_a: Any) -> None: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.timers.append((delay, fn))

    def run_timers(self, max_delay: float = 0.05) -> None:
        due = [t for t in self.timers if t[0] <= max_delay]
        self.timers = [t for t in self.timers if t[0] > max_delay]
        for _, fn in due:
            fn()


@contextlib.contextmanager
def veth_namespaces(prefix: str, addrs_a: list[str], addrs_b: list[str]) -> Iterator[tuple[str, str]]:
    """Two fresh namespaces joined by veth ``va``/``vb`` with these addresses (skips without root). At exit
    the processes the test left in them (stack services) get SIGTERM and both namespaces are deleted."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    netns = pytest.importorskip("pyrds.netns")
    a, b = netns.unique_name(prefix + "A"), netns.unique_name(prefix + "B")
    netns.create_netns(a)
    netns.create_netns(b)
    try:
        netns.create_veth(a, b, "va", "vb", addrs_a=addrs_a, addrs_b=addrs_b)
        yield a, b
    finally:
        for ns in (a, b):
            for pid in netns.netns_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            netns.delete_netns(ns)


class PageSink:
    """A data channel (``stack.sockstate.PushSink``) that keeps what is pushed and whose report page the test
    writes (``read``, ``taken``)."""

    max_payload = 1 << 20

    def __init__(self) -> None:
        self.read = 0
        self.taken = 0
        self.pushed: list[bytes] = []

    def push(
        self, saddr: bytes, sport: int, scope_id: int, payload: bytes, tail: bool, byte_follows: bool = False
    ) -> bool:
        self.pushed.append(payload)
        return True

    def reported(self) -> tuple[int, int]:
        return self.read, self.taken

    def set_sync(self, flag: bool, sync_at: int = 0) -> None: ...
    def unblock(self, consumed: int, in_channel: int) -> None: ...
    def publish_counts(self, queued: int, served: int) -> None: ...
    def publish_send(self, released: int, released_empty: int, sndbuf: int, epoch: int) -> None: ...
    def close(self) -> None: ...
