"""Messages accepted by a send and not yet handed to their transport.

The service answers a send before the message reaches a transport that does I/O (TCP): the result of a send
never depends on the transport's write, so the client goes on while the service writes. The send path puts
such messages here (:meth:`Stack.sendmsg` with an outbox) and the service calls :meth:`Outbox.flush` right
after the reply went out, also when the reply could not be sent: the message is queued and accounted.
"""

from __future__ import annotations

from pyrds.userspace.stack.sockstate import Outgoing
from pyrds.userspace.stack.transport import HashKey, Transport

__all__ = ["Outbox"]


class Outbox:
    def __init__(self) -> None:
        self._waiting: list[tuple[Transport, Outgoing, HashKey]] = []

    def put(self, transport: Transport, msg: Outgoing, hash_key: HashKey) -> None:
        self._waiting.append((transport, msg, hash_key))

    def flush(self) -> None:
        """Hand every waiting message to its transport, in the order they were sent."""
        waiting, self._waiting = self._waiting, []
        for transport, msg, hash_key in waiting:
            transport.transmit(msg, hash_key)
