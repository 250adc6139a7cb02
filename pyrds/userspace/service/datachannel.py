"""The data channel: received messages pushed to the client's own descriptor (service side).

Each RDS socket of a client gets, besides its readiness fd, one end of an AF_UNIX ``SOCK_SEQPACKET`` pair.
The service writes every received message the client may read without asking (:meth:`Stack.push_ready`) as
one packet: :data:`pyrds.userspace.rpc.PUSH_HDR` (data length, source port, scope id, address length, the
flags ``PUSH_TAIL`` and ``PUSH_BYTE_FOLLOWS``, the packed source address), then the payload. The client's
``recv`` is then a local read of its end; it reports what it consumed with a ``CONSUMED`` record on the
control connection, without waiting (the stack's receive accounting, congestion map and counters follow it).

The client's reads are reported asynchronously, except while they change what other sockets see at once
(the kernel's recvmsg uncongests the port and wakes senders before it returns): while the socket's port is
congested or a transport waits for its queue to drain, the service sets byte 0 of a page it shares with the
client (a sealed memfd the client maps read-only) and the client then waits for the service to take its
CONSUMED notice before its recv returns.

Since the report page (:data:`pyrds.userspace.rpc.REPORT_PAGE`, a second memfd the client maps read-write)
the client sends no notice at all for most reads: it counts them on that page, and the stack takes the count
(:meth:`DataChannel.reported`) when what it does next depends on it. It still sends one while byte 1 of the
shared page says the stack holds messages the channel had no room for (:meth:`DataChannel.push` found it
full).

Packets from the client on this pair are refused (the service end is shut for reading: the client's write
fails with EPIPE), so the only bytes that cross come from the service. The service never blocks on it: a
full channel (the client does not read) leaves the rest in the stack's receive queue until it has room.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import socket

from pyrds.userspace import rpc

#: asked for the service end's send buffer (SO_SNDBUFFORCE when privileged, else SO_SNDBUF capped by
#: net.core.wmem_max); the kernel doubles it. A message larger than what the buffer takes in one packet
#: stays for the request/reply path.
WANT_SNDBUF = 3 << 20
#: unix_dgram_sendmsg refuses len > sk_sndbuf - 32; the largest record we try is below that
_MARGIN = 64
_HDR = rpc.PUSH_HDR
_TAIL = rpc.PUSH_TAIL
_BYTE_FOLLOWS = rpc.PUSH_BYTE_FOLLOWS
#: the shared page: byte 0 is 1 while the client must report its reads synchronously
SHARED_SIZE = rpc.SHARED_PAGE
_F_SEAL_FUTURE_WRITE = 0x0010  # linux/fcntl.h; not in the stdlib's fcntl
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | _F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
#: the report page: the client writes it, but cannot resize it (a shrunk file would fault this side's reads)
_REPORT_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_REPORT = rpc.REPORT_COUNTS


def _shared_page(name: str = "pyrds-socket", seals: int = _SEALS) -> tuple[int, mmap.mmap]:
    """A one-page memfd, mapped read-write here and sealed with ``seals``: by default against resizing (a
    shrunk file would fault the service's reads and writes) and against any new writable mapping, so the
    client may only read it (the service's own mapping stays writable); the report page's seals leave out the
    latter, so the client may write it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, SHARED_SIZE)
        page = mmap.mmap(fd, SHARED_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        except BaseException:
            page.close()
            raise
    except BaseException:
        os.close(fd)
        raise
    return fd, page


class DataChannel:
    def __init__(self) -> None:
        self.srv, self.cli = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.page_fd = -1
        self.page: mmap.mmap | None = None
        #: the client's report page (rpc.REPORT_PAGE): it writes, this side only reads
        self.report_fd = -1
        self.report: mmap.mmap | None = None
        self.sync = False
        self.notify = False
        self.blocked = False  # the last push found the channel full and it has not drained to half since
        self._resume_at = -1  # while blocked: the messages left in the channel at which pushes resume
        try:
            self.page_fd, self.page = _shared_page()
            self.report_fd, self.report = _shared_page("pyrds-reads", _REPORT_SEALS)
            self.srv.setblocking(False)
            try:
                self.srv.setsockopt(socket.SOL_SOCKET, 32, WANT_SNDBUF)  # SO_SNDBUFFORCE
            except OSError:
                self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, WANT_SNDBUF)
            self.srv.shutdown(socket.SHUT_RD)
            sndbuf = self.srv.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        except BaseException:
            self.close()
            raise
        #: the largest payload one packet carries
        self.max_payload = max(0, sndbuf - _MARGIN - rpc.PUSH_HDR.size)

    def client_fds(self) -> tuple[int, int, int]:
        """The client's end of the channel, the shared page's memfd and the report page's."""
        return self.cli.fileno(), self.page_fd, self.report_fd

    def handed_over(self) -> None:
        """The client has its end and the page (SCM_RIGHTS sent): the service's copies are closed."""
        self.cli.close()
        self._close_fds()

    def _close_fds(self) -> None:
        if self.page_fd >= 0:
            os.close(self.page_fd)
            self.page_fd = -1
        if self.report_fd >= 0:
            os.close(self.report_fd)
            self.report_fd = -1

    def reported(self) -> tuple[int, int]:
        """What the client's report page says: messages it ever read from the channel, bytes it ever took
        from its readiness fd. Whatever the client wrote: the caller checks it."""
        if self.report is None:
            return 0, 0
        read, taken = _REPORT.unpack_from(self.report, rpc.REPORT_READ_AT)
        return read, taken

    def unblock(self, consumed: int, in_channel: int) -> None:
        """The client read ``consumed`` messages from the channel (a CONSUMED notice) and ``in_channel`` are
        still in it. A channel found full is tried again once at most half of what it held then is left
        (the client still has the other half to read): retrying after every read found room for about one
        message and then the channel full again, a failed sendmsg per message delivered."""
        if not self.blocked:
            return
        resume_at = self._resume_at
        if resume_at < 0:  # the first notice since the channel was found full: no push came in between
            resume_at = self._resume_at = (in_channel + consumed) // 2
        if in_channel <= resume_at:
            self.blocked = False
            self._resume_at = -1
            self._set_notify(False)

    def _set_notify(self, flag: bool) -> None:
        """Byte 1 of the shared page (rpc.PAGE_NOTIFY_AT): while 1 the client sends a notice after each
        read."""
        if flag != self.notify and self.page is not None:
            self.notify = flag
            self.page[rpc.PAGE_NOTIFY_AT] = 1 if flag else 0

    def set_sync(self, flag: bool, sync_at: int = 0) -> None:
        """Byte 0 of the shared page: while it is 1 the client reports synchronously each read whose count
        reaches ``sync_at`` (:data:`pyrds.userspace.rpc.PAGE_SYNC_AT`, written first)."""
        if self.page is None:
            return
        if flag:
            rpc.PAGE_COUNT.pack_into(self.page, rpc.PAGE_SYNC_AT, sync_at)
        if flag != self.sync:
            self.sync = flag
            self.page[0] = 1 if flag else 0

    def publish_counts(self, queued: int, served: int) -> None:
        """The receive queue's totals on the shared page (:data:`pyrds.userspace.rpc.SHARED_PAGE`): messages
        it ever took, and those that left it by request. Served first: a client reads queued after served,
        so a count it reads half-updated can only overstate what the queue holds."""
        if self.page is not None:
            rpc.PAGE_COUNT.pack_into(self.page, rpc.PAGE_SERVED_AT, served)
            rpc.PAGE_COUNT.pack_into(self.page, rpc.PAGE_QUEUED_AT, queued)

    def publish_send(self, released: int, released_empty: int, sndbuf: int, epoch: int) -> None:
        """What a posting client checks (:mod:`pyrds.userspace.service.posting`): bytes and empty messages
        ever released from the send buffer, the send buffer, then the post epoch last."""
        if self.page is not None:
            rpc.PAGE_COUNT.pack_into(self.page, rpc.PAGE_RELEASED_AT, released)
            rpc.PAGE_COUNT.pack_into(self.page, rpc.PAGE_EMPTY_RELEASED_AT, released_empty)
            rpc.PAGE_COUNT.pack_into(self.page, rpc.PAGE_SNDBUF_AT, sndbuf)
            rpc.PAGE_COUNT.pack_into(self.page, rpc.PAGE_EPOCH_AT, epoch)

    def push(
        self, saddr: bytes, sport: int, scope_id: int, payload: bytes, tail: bool, byte_follows: bool = False
    ) -> bool:
        """One message to the client; False when the channel has no room now (nothing was sent). Once the
        channel was found full, False without trying until :meth:`unblock` says the client read half of it
        (only a client read, which it reports, makes room: a full channel used to cost a failed sendmsg for
        every message delivered)."""
        if self.blocked:
            return False
        flags = (_TAIL if tail else 0) | (_BYTE_FOLLOWS if byte_follows else 0)
        head = _HDR.pack(len(payload), sport, scope_id, len(saddr), flags, saddr)
        try:
            self.srv.sendmsg([head, payload], [], socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self.blocked = True
            self._set_notify(True)  # only the client's reads make room: it says when it made some
            return False
        except OSError as exc:
            if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS, errno.ENOMEM):
                return False
            # EPIPE/ECONNRESET: the client closed its end; its control connection goes next
            return False
        return True

    def close(self) -> None:
        self.srv.close()
        self.cli.close()
        self._close_fds()
        if self.page is not None:
            self.page.close()
            self.page = None
        if self.report is not None:
            self.report.close()
            self.report = None
