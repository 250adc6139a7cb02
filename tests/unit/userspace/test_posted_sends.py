"""Posted sends (service/posting.py): after the stack took a send to a remote RDS/TCP destination, further
plain sends there return without waiting for the stack; its exact answer comes back when the client's own
account cannot promise one (a full send buffer, a congestion map update, an option set)."""

from __future__ import annotations

import errno
import ipaddress
import select
import socket
from typing import Any

import pytest

from pyrds.constants import SOL_RDS, SockOpt
from pyrds.userspace.control import stack_counters

pytestmark = pytest.mark.netns

COUNT = 400


def _sockaddr_in(host: str, port: int) -> bytes:
    packed = ipaddress.ip_address(host).packed
    return socket.AF_INET.to_bytes(2, "little") + port.to_bytes(2, "big") + packed + bytes(8)


def _send_retrying(a: Any, payload: bytes, dest: Any) -> None:
    while True:
        try:
            a.sendto(payload, socket.MSG_DONTWAIT, dest)
            return
        except OSError as exc:  # the send buffer is full until the peer acks: the stack said so
            assert exc.errno == errno.EAGAIN, exc
            a.settimeout(1)
            a.settimeout(None)


def test_sends_to_a_remote_destination_are_posted_in_order(userspace_netns_pair: Any) -> None:
    a, b = userspace_netns_pair.bound_pair()
    b_addr = b.getsockname()
    a.sendto(b"first", b_addr)  # taken with a reply: it carries the grant
    assert b.recv(100) == b"first"
    before = stack_counters(a)
    for i in range(COUNT):
        _send_retrying(a, b"m%d" % i, b_addr)
    got = [b.recv(100) for _ in range(COUNT)]
    assert got == [b"m%d" % i for i in range(COUNT)], "out of order, lost or duplicated"
    after = stack_counters(a)
    posted = after["send_posted"] - before["send_posted"]
    print(f"{posted} of {COUNT} sends were posted")
    assert posted >= COUNT // 2
    assert after["send_post_refused"] == 0


@pytest.mark.nft
def test_a_full_send_buffer_still_says_eagain(userspace_netns_pair: Any) -> None:
    """The kernel's rule (rds_sendmsg: queued bytes >= the socket's send buffer -> EAGAIN) with posting
    on: once nothing is acked (B's namespace drops A's segments), the send that finds the buffer full gets
    EAGAIN, after as many bytes as when every send is asked."""
    a, b = userspace_netns_pair.bound_pair()
    b_addr = b.getsockname()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # sndbuf 8192, rds_sndbuf 4096
    a.sendto(b"x" * 10, b_addr)  # the grant is made for this buffer
    assert b.recv(100) == b"x" * 10
    node_b = userspace_netns_pair.b
    node_b.sh("nft", "add table inet pyrds_posted")
    node_b.sh("nft", "add chain inet pyrds_posted in { type filter hook input priority 0 ; }")
    node_b.sh("nft", "add rule inet pyrds_posted in tcp dport 16385 drop")
    node_b.sh("nft", "add rule inet pyrds_posted in tcp sport 16385 drop")
    before = stack_counters(a)
    sent = 0
    with pytest.raises(OSError) as exc:
        for _ in range(100):
            a.sendto(b"y" * 1000, socket.MSG_DONTWAIT, b_addr)
            sent += 1
    assert exc.value.errno == errno.EAGAIN
    # queued 0, 1000, .., 4000 bytes < 4096 (the acked "x"s aside): five sends; the sixth finds 5000
    assert sent == 5
    after = stack_counters(a)
    # posted, but for a send made after a map update from B voided the grant (the connection's first)
    assert after["send_posted"] - before["send_posted"] >= 1, "no send was posted"
    assert after["send_post_refused"] == 0


def test_empty_posts_stop_at_the_stacks_cap_with_eagain(userspace_netns_pair: Any) -> None:
    """Empty messages add no bytes, so the byte account alone would let the client post them forever; the
    stack holds at most rds_sndbuf of them in flight (docs/userspace.md, "Bounded resources"). The client
    counts them too: past the cap it asks the stack and gets EAGAIN, and no post is refused (none lost)."""
    a, _b = userspace_netns_pair.bound_pair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # the minimum: sndbuf 4608
    rds_sndbuf = int(a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)) // 2
    assert rds_sndbuf == 2304
    # an address of A's subnet nobody has: the stack's dial never connects, nothing is ever acked
    nobody = (userspace_netns_pair.a.addr4.rsplit(".", 1)[0] + ".77", 4000)
    before = stack_counters(a)
    sent = 0
    with pytest.raises(OSError) as exc:
        for _ in range(rds_sndbuf + 10):
            a.sendto(b"", socket.MSG_DONTWAIT, nobody)
            sent += 1
    assert exc.value.errno == errno.EAGAIN
    assert sent == rds_sndbuf
    assert not a.poll(select.POLLOUT) & select.POLLOUT
    after = stack_counters(a)
    assert after["send_posted"] - before["send_posted"] >= rds_sndbuf // 2, "the sends were not posted"
    assert after["send_queue_msgs_full"] - before["send_queue_msgs_full"] == 1
    assert after["send_post_refused"] == 0
    a.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, _sockaddr_in(*nobody))
    assert a.poll(select.POLLOUT) & select.POLLOUT
    assert a.sendto(b"", socket.MSG_DONTWAIT, nobody) == 0
