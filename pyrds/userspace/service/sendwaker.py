"""The send waker: how a blocking send to a congested port learns that the port's map changed (service side).

The kernel's blocking rds_sendmsg sleeps in rds_cong_wait on the map's waitqueue and rds_cong_map_updated
wakes it. A client's blocking send that the stack answered with :data:`pyrds.userspace.rpc.WAIT_CONG` polls
the read end of this pipe instead (asked for once per socket with :attr:`pyrds.userspace.rpc.Op.SEND_WAKER`)
and sends again when it becomes readable: the stack writes one byte when a map update follows a send it told
to wait (:meth:`pyrds.userspace.stack.congestion.CongestionTable.map_updated`).

The client only gets the read end, so it can neither block nor flood the service: the service's end is
non-blocking and a byte that finds the pipe full (a client that never drains it) is dropped, which loses
nothing (one byte already says "try again").
"""

from __future__ import annotations

import os


class SendWaker:
    def __init__(self) -> None:
        self.rfd, self.wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def client_fd(self) -> int:
        return self.rfd

    def handed_over(self) -> None:
        """The client has the read end (SCM_RIGHTS sent): the service's copy is closed."""
        if self.rfd >= 0:
            os.close(self.rfd)
            self.rfd = -1

    def wake(self) -> None:
        if self.wfd < 0:
            return
        try:
            os.write(self.wfd, b"w")
        except (BlockingIOError, InterruptedError):
            pass  # full: the client has a wakeup pending already
        except OSError:
            pass  # the client closed its end

    def close(self) -> None:
        self.handed_over()
        if self.wfd >= 0:
            os.close(self.wfd)
            self.wfd = -1
