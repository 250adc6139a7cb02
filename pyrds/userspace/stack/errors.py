"""The stack's failures as the caller sees them.

:class:`StackError` is the one error type for "the kernel would return this errno": raised by every rule of
the stack (bind, send, cmsg checks, socket options, info tables) and turned into the reply's errno by the
service. :class:`MustWait` is not an error: a blocking send found its destination port congested and has to
wait (the kernel sleeps in ``rds_cong_wait``); the service tells the client to retry.
"""

from __future__ import annotations

__all__ = ["MustWait", "PushedFirst", "StackError"]


class StackError(Exception):
    """``code``: the errno; an optional second argument travels back with it (ENOSPC: the needed length)."""

    def __init__(self, code: int, *extra: object) -> None:
        super().__init__(code, *extra)
        self.code = code


class MustWait(Exception):
    """A blocking send to a congested port: the sender waits for the port to clear, then tries again."""


class PushedFirst(Exception):
    """A RECV request while messages the client has not read wait in its data channel (pushed after it last
    looked): it reads those first, in order, then asks again."""
