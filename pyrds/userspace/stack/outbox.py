"""Messages accepted by a send and not yet handed to their transport.

The service answers a send before the message reaches a transport that does I/O (TCP): the result of a send
never depends on the transport's write, so the client goes on while the service writes. The send path puts
such messages here (:meth:`Stack.sendmsg` with an outbox) and the service calls :meth:`Outbox.flush` right
after the reply went out, also when the reply could not be sent: the message is queued and accounted.

Nothing may raise once the reply is out (the caller could not learn of it): a transport that raises for one
message (a bug) has that message handed to ``failed`` (the stack forgets it and releases its send-buffer
bytes, :meth:`Stack.transmit_failed`), the error is logged, and the other messages still go out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyrds.userspace.stack.sockstate import Outgoing
from pyrds.userspace.stack.transport import HashKey, Transport

__all__ = ["Outbox"]

log = logging.getLogger("pyrds.userspace.service")


class Outbox:
    def __init__(self) -> None:
        self._waiting: list[tuple[Transport, Outgoing, HashKey]] = []

    def put(self, transport: Transport, msg: Outgoing, hash_key: HashKey) -> None:
        self._waiting.append((transport, msg, hash_key))

    def flush(self, failed: Callable[[Outgoing], None] | None = None) -> None:
        """Hand every waiting message to its transport, in the order they were sent, each transport corked
        meanwhile (several frames per write); never raises (a message a transport refused goes to
        ``failed``, or is only logged without one)."""
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        corked: list[Transport] = []
        try:
            for transport, msg, hash_key in waiting:
                if transport not in corked:
                    transport.cork()
                    corked.append(transport)
                try:
                    transport.transmit(msg, hash_key)
                except Exception:
                    log.exception("transport %s refused a message for %s: dropped", transport.kind, msg.daddr)
                    try:
                        if failed is not None:
                            failed(msg)
                    except Exception:
                        log.exception("releasing a refused message failed")
        finally:
            for transport in corked:
                try:
                    transport.uncork()
                except Exception:
                    log.exception("transport %s failed to write its queued messages", transport.kind)
