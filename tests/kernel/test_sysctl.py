"""RDS sysctls through pyrds.kernel.sysctl, in this netns and in a named one."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_helpers import recv_full, tcp_pair

from pyrds.kernel import sysctl


def test_defaults() -> None:
    vals = sysctl.read_all()
    assert vals["reconnect_min_delay_ms"] == 1
    assert vals["reconnect_max_delay_ms"] == 1000
    assert vals["max_unacked_packets"] == 8
    assert vals["max_unacked_bytes"] == 16 << 20
    assert vals["ping_enable"] == 1


def test_write_and_restore() -> None:
    old = sysctl.read("ping_enable")
    try:
        sysctl.write("ping_enable", 0)
        assert sysctl.read("ping_enable") == 0
    finally:
        sysctl.write("ping_enable", old)
    assert sysctl.read("ping_enable") == old


def test_unknown_name() -> None:
    with pytest.raises(ValueError):
        sysctl.read("nope")
    with pytest.raises(TypeError):
        sysctl.write("ping_enable", "1")  # type: ignore[arg-type]


def test_tcp_sysctls_per_netns(tcp_net: dict[str, str], sockets: list[Any]) -> None:
    ns = tcp_net["peer_ns"]
    here = sysctl.read("rds_tcp_sndbuf")
    there = sysctl.read("rds_tcp_sndbuf", netns=ns)
    assert here >= 0 and there >= 0
    sysctl.write("rds_tcp_rcvbuf", 262144, netns=ns)
    try:
        assert sysctl.read("rds_tcp_rcvbuf", netns=ns) == 262144
        assert sysctl.read("rds_tcp_rcvbuf") != 262144 or here == 262144
        # writing it dropped the peer netns' RDS/TCP connections: traffic still flows (reconnect)
        a, b = tcp_pair(tcp_net, sockets, port=4600)
        a.sendto(b"after", b.getsockname())
        assert recv_full(b, timeout=20)[0] == b"after"
    finally:
        sysctl.write("rds_tcp_rcvbuf", 0, netns=ns)
