"""asyncio for RDS sockets of either backend: awaitable send/receive and datagram endpoints.

Both backends' sockets are selectable (``fileno()`` is the kernel socket or, on the userspace backend, a
readiness fd whose POLLIN/POLLOUT mirror the RDS socket's), so this module only needs the event loop's
``add_reader``/``add_writer``::

    import asyncio, pyrds
    from pyrds.aio import AsyncRDSSocket

    async def main() -> None:
        async with AsyncRDSSocket(pyrds.socket()) as a, AsyncRDSSocket(pyrds.socket()) as b:
            a.bind(("127.0.0.1", 0))
            b.bind(("127.0.0.1", 0))
            await a.sendto(b"ping", b.getsockname())
            data, sender = await b.recvfrom(1024)

    asyncio.run(main())

The plain socket works with the loop's own calls too (``loop.sock_recv``, ``sock_recv_into``, ``sock_sendto``,
``sock_recvfrom``) once it is non-blocking. :func:`create_datagram_endpoint` gives a ``DatagramTransport``
and protocol, also on Python 3.11 and 3.12, whose ``loop.create_datagram_endpoint(sock=...)`` accepts only
SOCK_DGRAM sockets (3.13 accepts any non-stream socket; then it is used as is).

Sending never waits for a congested destination: a non-blocking RDS socket gets ENOBUFS (both backends, as
the kernel does), and so does the awaitable ``send``; retry later, or watch congestion updates
(``RDS_CONG_MONITOR``). Notifications (congestion updates, RDMA status, zerocopy completions) arrive as
ancillary data, on their own (0 bytes, no address) or with a message: ``await sock.recv_message()`` returns
them parsed (:mod:`pyrds.cmsg` records such as ``CongUpdate``, ``RdmaNotify``, ``ZcopyCompletion``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, NamedTuple, Self, TypeVar, overload

from pyrds import cmsg
from pyrds.addr import SockAddr
from pyrds.api import AncData, RDSSocketBase, ReadableBuffer, WritableBuffer

T = TypeVar("T")
P = TypeVar("P", bound=asyncio.DatagramProtocol)

__all__ = ["AsyncRDSSocket", "Message", "create_datagram_endpoint", "wait_io"]

RDS_MAX_MSG = 1 << 20  # RDS_MAX_MSG_SIZE: a receive of this size is never truncated


class Message(NamedTuple):
    """What one receive returned: the payload, the notifications and other ancillary data parsed by
    :func:`pyrds.cmsg.parse_ancdata` (``CongUpdate``, ``RdmaNotify``, ``ZcopyCompletion``, ``RdmaDest``,
    ``Timestamp``, ...), the MSG_* flags and the sender (None for a notification on its own)."""

    data: bytes
    notes: list[Any]
    flags: int
    address: SockAddr | None


async def wait_io(sock: RDSSocketBase, call: Callable[[], T], write: bool = False) -> T:
    """Run the non-blocking ``call`` on ``sock``; while it raises BlockingIOError, wait for the socket to
    become readable (or writable with ``write``) on the running loop and try again."""
    try:
        return call()
    except (BlockingIOError, InterruptedError):
        pass
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    fut: asyncio.Future[T] = loop.create_future()

    def ready() -> None:
        if fut.done():
            return
        try:
            result = call()
        except (BlockingIOError, InterruptedError):
            return  # spurious wake-up (another reader took the message): keep waiting
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    if write:
        loop.add_writer(fd, ready)
    else:
        loop.add_reader(fd, ready)
    try:
        return await fut
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


class AsyncRDSSocket:
    """An RDS socket (either backend) with awaitable I/O; the socket is made non-blocking.

    Non-I/O calls (``bind``, ``connect``, ``getsockname``, ``setsockopt``, ``get_info``, ...) are the wrapped
    socket's, reachable as attributes; ``sock`` is the wrapped socket itself."""

    def __init__(self, sock: RDSSocketBase) -> None:
        if not isinstance(sock, RDSSocketBase):
            raise TypeError(f"an RDS socket (pyrds.socket()) was expected, not {type(sock).__name__}")
        sock.setblocking(False)
        self.sock = sock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)

    def __repr__(self) -> str:
        return f"<pyrds.aio.AsyncRDSSocket {self.sock!r}>"

    def bind(self, address: SockAddr) -> None:
        self.sock.bind(address)

    def connect(self, address: SockAddr) -> None:
        self.sock.connect(address)

    def getsockname(self) -> SockAddr:
        return self.sock.getsockname()

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- receive
    async def recv(self, bufsize: int, flags: int = 0) -> bytes:
        return await wait_io(self.sock, lambda: self.sock.recv(bufsize, flags))

    async def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, SockAddr]:
        return await wait_io(self.sock, lambda: self.sock.recvfrom(bufsize, flags))

    async def recv_into(self, buffer: WritableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        return await wait_io(self.sock, lambda: self.sock.recv_into(buffer, nbytes, flags))

    async def recvfrom_into(
        self, buffer: WritableBuffer, nbytes: int = 0, flags: int = 0
    ) -> tuple[int, SockAddr]:
        return await wait_io(self.sock, lambda: self.sock.recvfrom_into(buffer, nbytes, flags))

    async def recvmsg(
        self, bufsize: int, ancbufsize: int = 0, flags: int = 0
    ) -> tuple[bytes, AncData, int, Any]:
        return await wait_io(self.sock, lambda: self.sock.recvmsg(bufsize, ancbufsize, flags))

    async def recv_message(
        self, bufsize: int = RDS_MAX_MSG, ancbufsize: int = 1024, flags: int = 0
    ) -> Message:
        """The next message or notification, with its ancillary data parsed (see :class:`Message`)."""
        data, anc, mflags, addr = await self.recvmsg(bufsize, ancbufsize, flags)
        return Message(data, cmsg.parse_ancdata(anc), mflags, addr)

    # -- send
    async def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        return await wait_io(self.sock, lambda: self.sock.send(data, flags), write=True)

    @overload
    async def sendto(self, data: ReadableBuffer, address: SockAddr, /) -> int: ...

    @overload
    async def sendto(self, data: ReadableBuffer, flags: int, address: SockAddr, /) -> int: ...

    async def sendto(self, data: ReadableBuffer, *args: Any) -> int:
        return await wait_io(self.sock, lambda: self.sock.sendto(data, *args), write=True)

    async def sendmsg(
        self,
        buffers: Iterable[ReadableBuffer],
        ancdata: Iterable[tuple[int, int, bytes]] = (),
        flags: int = 0,
        address: SockAddr | None = None,
    ) -> int:
        bufs, anc = list(buffers), list(ancdata)
        return await wait_io(self.sock, lambda: self.sock.sendmsg(bufs, anc, flags, address), write=True)


async def create_datagram_endpoint(
    protocol_factory: Callable[[], P], sock: RDSSocketBase
) -> tuple[asyncio.DatagramTransport, P]:
    """``loop.create_datagram_endpoint(protocol_factory, sock=sock)`` for an RDS socket, on the running loop.

    Python 3.13 accepts SOCK_SEQPACKET sockets and is called directly. 3.11 and 3.12 refuse any socket whose
    type is not SOCK_DGRAM (a stdlib ``socket(AF_RDS, SOCK_SEQPACKET)`` too), so there the selector loop's
    datagram transport is made the way that method makes it after its type check. Messages larger than the
    transport's read size (256 KiB) are truncated, as for UDP."""
    if isinstance(sock, AsyncRDSSocket):
        sock = sock.sock
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 13):
        transport, protocol = await loop.create_datagram_endpoint(protocol_factory, sock=sock)  # type: ignore[arg-type]
        return transport, protocol
    make = getattr(loop, "_make_datagram_transport", None)
    if make is None:
        raise NotImplementedError(f"{type(loop).__name__} has no datagram transport for sockets")
    sock.setblocking(False)
    protocol = protocol_factory()
    waiter: asyncio.Future[None] = loop.create_future()
    transport: asyncio.DatagramTransport = make(sock, protocol, None, waiter)
    try:
        await waiter
    except BaseException:
        transport.close()
        raise
    return transport, protocol
