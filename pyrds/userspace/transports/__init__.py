"""The transports of the userspace stack, peers behind one interface
(:class:`pyrds.userspace.stack.transport.Transport`): ``loop`` for destinations on this node, ``tcp`` for
RDS/TCP peers, ``ib`` for RDS/IB peers (sockets pinned to it; pyverbs is imported only when it is made). Code
outside a transport's package makes one with these functions and then only uses the interface; it never names
a transport's classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyrds.userspace.stack.transport import EventLoop, StackHost, Transport

if TYPE_CHECKING:
    from pyrds.userspace.transports.ib.verbs import Verbs

__all__ = ["ib_transport", "loop_transport", "rdma_available", "tcp_transport"]


def loop_transport(host: StackHost) -> Transport:
    from pyrds.userspace.transports.loop import LoopTransport

    return LoopTransport(host)


def tcp_transport(host: StackHost, loop: EventLoop) -> Transport:
    from pyrds.userspace.transports.tcp.transport import TcpTransport

    return TcpTransport(host, loop)


def rdma_available() -> bool:
    """This node lists RDMA devices (sysfs; imports nothing of pyverbs)."""
    from pyrds.userspace.transports.ib.devices import rdma_devices

    return bool(rdma_devices())


def ib_transport(
    host: StackHost, loop: EventLoop, verbs: Verbs | None = None, *, listen: bool = True
) -> Transport:
    """The RDS/IB transport over ``verbs`` (default: pyverbs, imported here: ImportError without it)."""
    from pyrds.userspace.transports.ib.fdloop import EventFdLoop
    from pyrds.userspace.transports.ib.transport import IbTransport

    if verbs is None:
        from pyrds.userspace.transports.ib.pyverbs_backend import PyverbsVerbs

        verbs = PyverbsVerbs()
    return IbTransport(host, EventFdLoop(loop), verbs, listen=listen)
