"""A blocking send to a congested port sleeps until the map update that uncongests it, and the kernel counts
the call once in ``cong_send_blocked`` (cong.c rds_cong_wait: the counter, then wait_event_interruptible on
the map's waitqueue; rds_sendmsg calls it once per call). The userspace stack follows: its client asks
again after each wake, and those asks are not counted again (tests/unit/userspace/test_send_waker.py).

RDS/TCP over the veth pair of ``tcp_net``: the receiver in the peer namespace, the sender here. The guest
runs tests/kernel one test at a time, so no other RDS traffic moves the (host-wide) counters meanwhile."""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Any

from kernel_helpers import make_socket

from pyrds.constants import InfoType
from pyrds.info import counters_dict
from pyrds.testing.helpers import send_until_enobufs

MSG = 1024


def _blocked(sock: Any) -> int:
    return counters_dict(sock.get_info(InfoType.RDS_INFO_COUNTERS))["cong_send_blocked"]


def test_blocking_send_to_a_congested_port_waits_and_counts_once(
    tcp_net: dict[str, str], sockets: list[Any]
) -> None:
    receiver = make_socket(netns=tcp_net["peer_ns"])
    sender = make_socket()
    sockets += [receiver, sender]
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    receiver.bind((tcp_net["b4"], 0))
    sender.bind((tcp_net["a4"], 0))
    dest = receiver.getsockname()
    sender.setblocking(False)
    sent, congested = send_until_enobufs(sender, dest, MSG, timeout=30.0)
    assert congested, f"no ENOBUFS after {sent} messages"
    sender.setblocking(True)
    before = _blocked(sender)
    outcome: list[object] = []

    def blocking_send() -> None:
        try:
            outcome.append(sender.sendto(b"y" * MSG, dest))
        except OSError as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=blocking_send, daemon=True)
    thread.start()
    time.sleep(0.5)
    assert not outcome, f"the blocking send did not wait for the congested port: {outcome}"
    # the port stays congested until the receiver reads: the call sleeps, counted once
    receiver.setblocking(False)
    got = 0
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            receiver.recv(65536)
            got += 1
        except OSError as exc:
            assert exc.errno == errno.EAGAIN, exc
            time.sleep(0.01)
    thread.join(5)
    assert outcome == [MSG], outcome
    assert _blocked(sender) - before == 1
    assert got >= 1
