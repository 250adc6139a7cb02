"""The congestion probe of a failed two-node scenario's diagnosis (TwoNodes.print_congestion_views): each
node says whether it sees each test socket's port as congested, its own map over the loop connection and its
copy of the peer's map over RDS/TCP, so a stalled sender's stale copy is told apart from a receiver that
still counts its port as congested."""

from __future__ import annotations

from socket import SO_RCVBUF, SOL_SOCKET

import pytest

from pyrds.testing.helpers import send_until_enobufs

pytestmark = pytest.mark.netns


def _views(pair, socks, capsys) -> dict[tuple[str, str], str]:  # type: ignore[no-untyped-def]
    pair.print_congestion_views(socks)
    out = capsys.readouterr().out
    views = {}
    for line in out.splitlines():
        if "congestion probe" not in line:
            assert "probe failed" not in line, out
            continue
        head, seen = line.split(": ", 1)
        src = head.split()[3]
        dst = head.split("-> ")[1].split(" (")[0]
        views[(src, dst)] = seen
    assert len(views) == 4, out
    return views


def test_probe_tells_own_map_from_peer_copy(userspace_netns_pair, capsys) -> None:  # type: ignore[no-untyped-def]
    na, nb = userspace_netns_pair.a, userspace_netns_pair.b
    a, b = userspace_netns_pair.bound_pair()
    bname = str(b.getsockname())
    views = _views(userspace_netns_pair, [a, b], capsys)
    assert all(v == "clear (sent)" for v in views.values()), views
    b.setsockopt(SOL_SOCKET, SO_RCVBUF, 4096)  # the floor: a few messages congest B's port
    _sent, congested = send_until_enobufs(a, b.getsockname(), 1024, timeout=30.0)
    assert congested, "B's port never congested"
    views = _views(userspace_netns_pair, [a, b], capsys)
    assert views[(na.addr4, bname)] == "congested (ENOBUFS)", views  # A's copy of B's map
    assert views[(nb.addr4, bname)] == "congested (ENOBUFS)", views  # B's own map
    assert views[(na.addr4, str(a.getsockname()))] == "clear (sent)", views
