"""The transports of the userspace stack, peers behind one interface
(:class:`pyrds.userspace.stack.transport.Transport`): ``loop`` for destinations on this node, ``tcp`` for
RDS/TCP peers. Code outside a transport's package makes one with these functions and then only uses the
interface; it never names a transport's classes.
"""

from __future__ import annotations

from pyrds.userspace.stack.transport import EventLoop, StackHost, Transport

__all__ = ["loop_transport", "tcp_transport"]


def loop_transport(host: StackHost) -> Transport:
    from pyrds.userspace.transports.loop import LoopTransport

    return LoopTransport(host)


def tcp_transport(host: StackHost, loop: EventLoop) -> Transport:
    from pyrds.userspace.transports.tcp.transport import TcpTransport

    return TcpTransport(host, loop)
