"""RDS/TCP messages reach their reader through its data channel (service/datachannel.py) when the read they
came in ended with our TCP's ACK sent; in order, exactly once, mixed with those served by request."""

from __future__ import annotations

from typing import Any

import pytest

from pyrds.userspace.control import stack_counters

pytestmark = pytest.mark.netns

COUNT = 300


def test_rds_tcp_messages_are_pushed_to_the_reader_in_order(userspace_netns_pair: Any) -> None:
    a, b = userspace_netns_pair.bound_pair()
    b_addr = b.getsockname()
    b.settimeout(30)
    a.sendto(b"warm-up", b_addr)
    assert b.recv(100) == b"warm-up"
    before = stack_counters(b)
    got = []
    for i in range(COUNT):
        a.sendto(b"m%d" % i, b_addr)
        if i % 3 == 0:  # a reader that keeps up now and then (acked reads) and falls behind in between
            got.append(b.recv(100))
    got.extend(b.recv(100) for _ in range(COUNT - len(got)))
    assert got == [b"m%d" % i for i in range(COUNT)], "out of order, lost or duplicated"
    b.settimeout(0.5)
    with pytest.raises(OSError):
        b.recv(100)  # nothing twice
    after = stack_counters(b)
    pushed = after["recv_pushed"] - before["recv_pushed"]
    print(f"pushed {pushed} of {COUNT}")
    assert pushed >= 1, "no RDS/TCP message went to the data channel"
    assert after["recv_delivered"] - before["recv_delivered"] == COUNT
