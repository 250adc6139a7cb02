"""The service's :class:`~pyrds.userspace.stack.transport.EventLoop` as the driver's
:class:`~pyrds.userspace.transports.ib.driver.FdLoop`: readers by raw fd, no ready mask."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Callable
from typing import cast

from pyrds.userspace.stack.transport import EventLoop

__all__ = ["EventFdLoop"]


class _Fd:
    """A raw fd as a selectable object (selectors only calls ``fileno``)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


class EventFdLoop:
    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self._fds: dict[int, _Fd] = {}

    def add_reader(self, fd: int, cb: Callable[[], None]) -> None:
        if fd in self._fds:
            raise ValueError(f"fd {fd} is registered already")
        obj = self._fds[fd] = _Fd(fd)
        self.loop.register(cast(socket.socket, obj), selectors.EVENT_READ, lambda _mask: cb())

    def remove_reader(self, fd: int) -> None:
        obj = self._fds.pop(fd, None)
        if obj is not None:
            self.loop.unregister(cast(socket.socket, obj))

    def call_later(self, delay: float, cb: Callable[[], None]) -> None:
        self.loop.call_later(delay, cb)
