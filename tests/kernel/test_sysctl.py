"""RDS sysctls through pyrds.kernel.sysctl, in this netns and in a named one."""

from __future__ import annotations

import errno
from typing import Any

import pytest
from kernel_helpers import recv_full, tcp_pair

from pyrds.kernel import sysctl


def test_defaults() -> None:
    """6.1 differs from rds-facts: reconnect_min_delay_ms reads 4, not 1 (the default is
    msecs_to_jiffies(1) = 1 jiffy, shown in ms by proc_doulongvec_ms_jiffies_minmax; Debian HZ=250)."""
    vals = sysctl.read_all()
    hz_ms = vals["reconnect_min_delay_ms"]
    assert hz_ms in (1, 4, 10)  # one jiffy at HZ 1000/250/100
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
    """6.1 differs from rds-facts: rds_tcp_sndbuf/rcvbuf read 0 ("kernel default") but writing 0 is refused
    (EINVAL, the minimum is SOCK_MIN_SNDBUF/RCVBUF), so the default cannot be restored once changed."""
    ns = tcp_net["peer_ns"]
    here = sysctl.read("rds_tcp_rcvbuf")
    assert sysctl.read("rds_tcp_sndbuf") >= 0
    sysctl.write("rds_tcp_rcvbuf", 262144, netns=ns)
    assert sysctl.read("rds_tcp_rcvbuf", netns=ns) == 262144
    assert sysctl.read("rds_tcp_rcvbuf") == here  # the other netns is untouched
    with pytest.raises(OSError) as ei:
        sysctl.write("rds_tcp_rcvbuf", 0, netns=ns)
    assert ei.value.errno == errno.EINVAL
    # writing it dropped the peer netns' RDS/TCP connections: traffic still flows (reconnect)
    a, b = tcp_pair(tcp_net, sockets, port=4600)
    a.sendto(b"after", b.getsockname())
    assert recv_full(b, timeout=20)[0] == b"after"
