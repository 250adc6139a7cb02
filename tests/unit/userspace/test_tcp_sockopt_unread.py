"""SIOCINQ on a TCP socket: bytes received (and acked by TCP) that nobody read; the TCP transport counts them
when it closes a connection, because an RDS/TCP sender frees messages once TCP acked them."""

from __future__ import annotations

import socket
import time

from pyrds.userspace.transports.tcp.sockopt import unread_bytes


def test_unread_bytes_counts_what_tcp_received_and_nobody_read() -> None:
    lst = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()
    try:
        assert unread_bytes(b) == 0
        a.sendall(b"x" * 1000)
        deadline = time.monotonic() + 5
        while unread_bytes(b) < 1000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert unread_bytes(b) == 1000
        b.recv(400)
        assert unread_bytes(b) == 600
    finally:
        for s in (a, b, lst):
            s.close()
    assert unread_bytes(b) == 0  # a closed socket: no error, 0
