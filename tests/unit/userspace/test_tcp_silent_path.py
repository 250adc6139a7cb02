"""A path whose peer went silent must not keep the peer's re-dial waiting for minutes.

Two userspace stacks in two namespaces. Node A (the smaller address) owns the RDS/TCP connection, node B
accepts. Every packet A's current connections send is then dropped in A's namespace (nftables), so to B
those connections go silent: no ack, no FIN, no reset (what B sees when A's reset of a connection is lost
and A's host stops answering on it). B keeps sending to A on one path, so that path's TCP has unacked
data and sits in retransmission backoff, where a keepalive probe is never made. A then drops and re-dials
its paths from new ports.

Every RDS/TCP dialer closes a path's connection before dialling it again, so a re-dial from the peer's
address for a path whose own connection has heard nothing from the peer since is the peer: B drops the
silent connection (``tcp_path_silent_dropped``) and the waiting one takes the path. Before, the re-dial
waited until B's TCP gave up on the silent connection (``tcp_retries2``: about 15 minutes), and A's
messages on that path stalled as long (the CI stall of ``test_tcp_reconnect_netns``: one path retransmitting
with backoff 8 and nothing heard for 62 s, one connection deferred). Every message B sent still arrives
exactly once: those A's TCP acked in vain are retransmitted on the new connection and dropped there as
duplicates."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyrds.constants import PYRDS_INFO_STACK_COUNTERS, SOL_RDS, InfoType
from pyrds.info import counters_dict, parse_info

pytestmark = pytest.mark.netns

#: B's messages to A must all arrive within this long after A's re-dial (before the fix: ~15 minutes)
RECOVERY_S = 40.0


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if os.geteuid() != 0 or shutil.which("nft") is None:
        pytest.skip("needs root and nft")
    monkeypatch.delenv("PYRDS_TCP_PORT", raising=False)  # the stacks live in their own namespaces: port 16385
    from pyrds.testing.topology import TwoNodes

    pair = TwoNodes.create(["userspace", "userspace"])
    try:
        yield pair
    finally:
        pair.destroy()


def stack_counters(sock: Any) -> dict[str, int]:
    raw = sock.getsockopt(SOL_RDS, PYRDS_INFO_STACK_COUNTERS, 1 << 16)
    return counters_dict(parse_info(InfoType.RDS_INFO_COUNTERS, raw))


def test_a_redial_replaces_a_path_the_peer_went_silent_on(nodes: Any, tmp_path: Any) -> None:
    na = nodes.a
    a, b = nodes.bound_pair()
    a_addr = a.getsockname()
    b.sendto(b"warm-up", a_addr)
    a.settimeout(30)
    assert a.recv(100) == b"warm-up"
    time.sleep(1.5)  # the owner brings its other paths up after the handshake
    old_ports = sorted({row.peer_port for row in b.get_info(InfoType.RDS_INFO_TCP_SOCKETS)})
    assert old_ports, "B shows no RDS/TCP connection"
    ports = ", ".join(str(p) for p in old_ports)
    rules = tmp_path / "silent.nft"
    rules.write_text(
        "table inet pyrds_silent {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
        f"  tcp dport 16385 tcp sport {{ {ports} }} drop\n }}\n}}\n"
    )
    na.sh("nft", "-f", str(rules))
    sent = [b"silent-%d" % i for i in range(20)]
    for msg in sent[:10]:  # A's TCP takes these but its acks are dropped: B retransmits with backoff
        b.sendto(msg, a_addr)
        time.sleep(0.1)
    time.sleep(1.0)
    na.force_reconnect()  # A closes every path (its FINs are dropped too) and re-dials from new ports
    for msg in sent[10:]:
        b.sendto(msg, a_addr)
        time.sleep(0.1)
    got: list[bytes] = []
    deadline = time.monotonic() + RECOVERY_S
    while len(got) < len(sent) and time.monotonic() < deadline:
        a.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            got.append(a.recv(100))
        except TimeoutError:
            break
    counters = stack_counters(b)
    assert got == sent, (
        f"A got {len(got)} of B's {len(sent)} messages in {RECOVERY_S:g}s: {got!r}; B's counters "
        f"tcp_accept_deferred={counters.get('tcp_accept_deferred')} "
        f"tcp_path_silent_dropped={counters.get('tcp_path_silent_dropped')}"
    )
    a.settimeout(1.0)
    with pytest.raises(TimeoutError):  # nothing twice
        extra = a.recv(100)
        raise AssertionError(f"delivered twice: {extra!r}")
    assert counters["tcp_path_silent_dropped"] >= 1
    a.sendto(b"a-to-b", b.getsockname())  # and the other way on the new connections
    b.settimeout(30)
    assert b.recv(100) == b"a-to-b"
