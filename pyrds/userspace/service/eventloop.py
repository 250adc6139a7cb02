"""The daemon's event loop: a ``selectors`` selector plus timers, single-threaded.

It implements :class:`pyrds.userspace.stack.transport.EventLoop` for the transports and serves the service's
own sockets (the control listener and connections).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import selectors
import socket
import time
from collections.abc import Callable

__all__ = ["IoCallback", "SelectorLoop"]

log = logging.getLogger("pyrds.userspace.service")
IoCallback = Callable[[int], None]


class SelectorLoop:
    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def register(self, sock: socket.socket, events: int, cb: IoCallback) -> None:
        self.sel.register(sock, events, cb)

    def modify(self, sock: socket.socket, events: int, cb: IoCallback) -> None:
        self.sel.modify(sock, events, cb)

    def unregister(self, sock: socket.socket) -> None:
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def call_later(self, delay: float, cb: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), cb))

    def run_once(self, max_wait: float) -> float:
        """Wait up to ``max_wait`` seconds (less when a timer is due), run the ready callbacks and the due
        timers; returns the time after. A failing callback is logged: a bug in one handler must not kill the
        stack."""
        timeout = max_wait
        if self._timers:
            timeout = max(0.0, min(timeout, self._timers[0][0] - time.monotonic()))
        for key, mask in self.sel.select(timeout):
            try:
                key.data(mask)
            except Exception:
                log.exception("handler failed")
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, cb = heapq.heappop(self._timers)
            try:
                cb()
            except Exception:
                log.exception("timer failed")
        return now

    def close(self) -> None:
        self.sel.close()
