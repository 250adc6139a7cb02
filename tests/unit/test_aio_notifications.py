"""``AsyncRDSSocket.recv_message``: a notification awaited on the event loop arrives parsed (userspace backend
on this host; a receiver bound with SO_RDS_TRANSPORT=TCP on 127.0.0.1 congests, as the kernel's does)."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

import pyrds
from pyrds.aio import AsyncRDSSocket, Message
from pyrds.cmsg import CongUpdate
from pyrds.constants import SOL_RDS, SockOpt, Transport, cong_monitor_mask


def test_congestion_update_is_awaited_and_parsed() -> None:
    r = pyrds.socket("userspace")
    s = AsyncRDSSocket(pyrds.socket("userspace"))
    try:
        r.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, Transport.TCP)
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        r.bind(("127.0.0.1", 0))
        s.bind(("127.0.0.1", 0))
        s.setsockopt(SOL_RDS, SockOpt.RDS_CONG_MONITOR, 1)
        dest = r.getsockname()

        async def main() -> tuple[int, Message]:
            sent = 0
            with pytest.raises(OSError) as info:
                for _ in range(100):
                    await s.sendto(b"c" * 1000, dest)
                    sent += 1
            assert info.value.errno == errno.ENOBUFS  # congested: a non-blocking send does not wait
            note = asyncio.ensure_future(s.recv_message())
            await asyncio.sleep(0.05)
            assert not note.done()  # nothing yet: the receiver is still congested
            r.settimeout(5)
            for _ in range(sent):
                assert len(r.recv(2000)) == 1000
            return sent, await asyncio.wait_for(note, 20)

        sent, msg = asyncio.run(main())
        assert sent >= 2
        assert msg.data == b"" and msg.address is None
        updates = [n for n in msg.notes if isinstance(n, CongUpdate)]
        assert updates and updates[0].mask & cong_monitor_mask(dest[1]), msg
    finally:
        r.close()
        s.close()
