"""Posted sends: a client's send that does not wait for the stack (service side).

The kernel's sendmsg to a remote RDS/TCP destination returns once the message is queued on the connection;
its errors come from checks made in the caller's context: the arguments, the destination port's bit in the
peer's congestion map (ENOBUFS, or a wait), the socket's send buffer (EAGAIN, or a wait). The userspace
client can make those checks itself for a destination the stack already took a send to, so it need not wait
for the stack's reply:

- The reply to a SEND the stack took carries a **grant** (:meth:`Stack.grant_posts`): the socket's post
  epoch, when the destination is remote and reached over a transport that does I/O. Never for a local
  destination: there the kernel queues the message on the receiver (and its congestion changes) within the
  sender's call.
- While the epoch on the socket's shared page is still the granted one, the client sends further plain
  messages (no ancillary data, flags 0 or MSG_DONTWAIT) to that same destination as ``POST`` notices and
  returns at once, when its own account of the send buffer has room: the bytes it ever sent, less the bytes
  the page says ever left the buffer, are below the buffer the grant was made for; for an empty message
  also the empty messages it ever sent, less those the page says ever left, are below that buffer (the
  stack holds at most that many empty messages in flight, :meth:`SockState.send_full`: the kernel, whose
  byte count they do not move, queues them without limit). Both counts only overstate what the socket
  holds. Otherwise it sends a SEND and waits, and gets the stack's exact answer (the kernel's, but for an
  empty message beyond that cap: EAGAIN, or a wait for POLLOUT).
- The stack voids grants by moving the epoch: a congestion map update from the destination's peer, any
  setsockopt, connect. A post the client made before it saw the new epoch is still taken, as a send the
  kernel checked before the map update arrived.

The stack still checks every post (:meth:`Stack.sendmsg` with ``posted``): a post outside its grant (another
destination, a send buffer or empty-message count the client let overflow) is refused and counted
(``send_post_refused``); only the client that broke the rules loses its message. Posts cross the control
connection in order with the client's requests, so whatever the client asks next sees them; requests of
other clients first take the posts already sent (``Service._settle``).
"""

from __future__ import annotations

import logging

from pyrds.addr import IPAddress
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.outbox import Outbox
from pyrds.userspace.stack.sockstate import SockState

__all__ = ["take_post"]

log = logging.getLogger("pyrds.userspace.service")


def take_post(
    stack: Stack,
    rs: SockState,
    payload: bytes,
    flags: int,
    dest: tuple[IPAddress, int] | None,
    outbox: Outbox,
) -> None:
    """Queue one posted send (its transport write goes to ``outbox``); a refused one is counted and
    logged, never answered: its client returned from the send already."""
    try:
        stack.sendmsg(rs, payload, (), flags, dest, True, outbox, posted=True)
    except StackError as exc:
        stack.counters["send_post_refused"] += 1
        log.warning("refused a posted send of socket %d: errno %d", rs.sock_id, exc.code)
        return
    stack.counters["send_posted"] += 1
