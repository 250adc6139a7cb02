"""The daemon's event loop: an epoll selector plus timers, single-threaded.

It implements :class:`pyrds.userspace.stack.transport.EventLoop` for the transports and serves the service's
own sockets (the control listener and connections).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import select
import selectors
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["EpollSelector", "IoCallback", "SelectorLoop"]

log = logging.getLogger("pyrds.userspace.service")
IoCallback = Callable[[int], None]
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE


def _fileobj_to_fd(fileobj: Any) -> int:
    """A descriptor, or an object with ``fileno()``, as its fd (ValueError: invalid), as selectors does."""
    if isinstance(fileobj, int):
        fd = fileobj
    else:
        try:
            fd = int(fileobj.fileno())
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"Invalid file object: {fileobj!r}") from None
    if fd < 0:
        raise ValueError(f"Invalid file descriptor: {fd}")
    return fd


def _epoll_events(events: int) -> int:
    return (select.EPOLLIN if events & _R else 0) | (select.EPOLLOUT if events & _W else 0)


class EpollSelector(selectors.BaseSelector):
    """``selectors.EpollSelector``'s registrations (the same keys and errors; a closed file object can still
    be unregistered), with its epoll object and fd -> key map open to :meth:`SelectorLoop.run_once`, which
    polls and dispatches itself (selectors' ``select`` and its per-fd key lookup cost several calls per
    wakeup)."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.keys: dict[int, selectors.SelectorKey] = {}
        #: epoll_wait's maxevents: as many as are registered (at least 1), kept by (un)register
        self.maxevents = 1

    def _lookup(self, fileobj: Any) -> int:
        """The fd of ``fileobj``; one that no longer has one (closed) is found among the registered."""
        try:
            return _fileobj_to_fd(fileobj)
        except ValueError:
            for key in self.keys.values():
                if key.fileobj is fileobj:
                    return key.fd
            raise

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        if (not events) or (events & ~(_R | _W)):
            raise ValueError(f"Invalid events: {events!r}")
        key = selectors.SelectorKey(fileobj, self._lookup(fileobj), events, data)
        if key.fd in self.keys:
            raise KeyError(f"{fileobj!r} (FD {key.fd}) is already registered")
        self.keys[key.fd] = key
        try:
            self.epoll.register(key.fd, _epoll_events(events))
        except BaseException:
            del self.keys[key.fd]
            raise
        self._count()
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        try:
            key = self.keys.pop(self._lookup(fileobj))
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        self._count()
        try:
            self.epoll.unregister(key.fd)
        except OSError:  # the fd was closed since it was registered
            pass
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        try:
            key = self.keys[self._lookup(fileobj)]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        changed = False
        if events != key.events:
            try:
                self.epoll.modify(key.fd, _epoll_events(events))
            except BaseException:
                del self.keys[key.fd]  # as selectors: a failed modify leaves the file object unregistered
                self._count()
                raise
            changed = True
        if data != key.data:
            changed = True
        if changed:
            key = key._replace(events=events, data=data)
            self.keys[key.fd] = key
        return key

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        keys = self.keys
        return [(keys[fd], mask & keys[fd].events) for fd, mask in self.poll(timeout) if fd in keys]

    def poll(self, timeout: float | None) -> list[tuple[int, int]]:
        """epoll_wait for at most ``timeout`` seconds (None: no limit): (fd, selector mask) per ready fd.
        EPOLLERR/EPOLLHUP give both EVENT_READ and EVENT_WRITE, as selectors does (the caller masks them
        with the registered events)."""
        if timeout is None:
            timeout = -1
        elif timeout <= 0:
            timeout = 0
        # epoll_wait's 1 ms resolution: Python rounds the timeout up, so it waits *at least* timeout
        try:
            ready = self.epoll.poll(timeout, self.maxevents)
        except InterruptedError:
            return []
        return [(fd, _selector_mask(ev)) for fd, ev in ready]

    def _count(self) -> None:
        self.maxevents = max(len(self.keys), 1)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return {key.fileobj: key for key in self.keys.values()}

    def close(self) -> None:
        self.keys.clear()
        self._count()
        self.epoll.close()


def _selector_mask(ev: int) -> int:
    """The selectors mask of an epoll event: anything but EPOLLIN (EPOLLOUT, ERR, HUP) is writable, anything
    but EPOLLOUT is readable."""
    return (_W if ev & ~select.EPOLLIN else 0) | (_R if ev & ~select.EPOLLOUT else 0)


class SelectorLoop:
    def __init__(self) -> None:
        self.sel = EpollSelector()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        #: passes of :meth:`run_once` so far: a handler may tell whether it ran in the last one too
        self.passes = 0

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
        self.passes += 1
        timeout = max_wait
        timers = self._timers
        if timers:
            due = timers[0][0] - time.monotonic()
            if due < timeout:
                timeout = due
        if timeout < 0:
            timeout = 0.0
        sel = self.sel
        keys = sel.keys
        try:
            ready = sel.epoll.poll(timeout, sel.maxevents)  # rounds up to epoll's ms: waits at least timeout
        except InterruptedError:
            ready = []
        if len(ready) == 1:  # request/response: one fd per wakeup (no list of keys to build)
            fd, ev = ready[0]
            if fd in keys:
                key = keys[fd]
                mask = (_W if ev & ~select.EPOLLIN else 0) | (_R if ev & ~select.EPOLLOUT else 0)
                try:
                    key.data(mask & key.events)
                except Exception:
                    log.exception("handler failed")
        elif ready:
            # every key is taken before any callback runs (one may unregister or modify another ready fd), as
            # selectors' select() does
            calls = [(keys[fd], ev) for fd, ev in ready if fd in keys]
            for key, ev in calls:
                # _selector_mask, inline
                mask = (_W if ev & ~select.EPOLLIN else 0) | (_R if ev & ~select.EPOLLOUT else 0)
                try:
                    key.data(mask & key.events)
                except Exception:
                    log.exception("handler failed")
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            _, _, cb = heapq.heappop(timers)
            try:
                cb()
            except Exception:
                log.exception("timer failed")
        return now

    def close(self) -> None:
        self.sel.close()
