"""The readiness fd: a real file descriptor whose poll state mirrors an RDS socket's (service side).

The service creates ``socketpair(AF_UNIX, SOCK_STREAM)`` A<->B and hands A to the client as ``fileno()``.
POLLIN on A: the service keeps one byte queued B->A while the socket has messages/notifications, and reads it
back from A when the queue empties. POLLOUT on A: while the socket's queued send bytes are >= sndbuf/2 the
service fills A's (tiny) send buffer so A is not writable, and drains B to make A writable again. The service
only uses MSG_DONTWAIT so the file status flags the client shares are never touched.
"""

from __future__ import annotations

import socket

_NB = socket.MSG_DONTWAIT


class Readiness:
    def __init__(self) -> None:
        self.a, self.b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # clamps to SOCK_MIN_SNDBUF
        self.readable = False
        self.writable = True

    def client_fd(self) -> int:
        return self.a.fileno()

    def set_readable(self, flag: bool) -> None:
        if flag == self.readable:
            return
        self.readable = flag
        try:
            if flag:
                self.b.send(b"r", _NB)
            else:
                while self.a.recv(4096, _NB):
                    pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass

    def set_writable(self, flag: bool) -> None:
        if flag == self.writable:
            return
        self.writable = flag
        chunk = b"w" * 4096
        try:
            if flag:
                while self.b.recv(65536, _NB):
                    pass
            else:
                while True:
                    self.a.send(chunk, _NB)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass

    def close(self) -> None:
        self.a.close()
        self.b.close()
