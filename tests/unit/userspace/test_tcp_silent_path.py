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

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from pyrds.constants import PYRDS_INFO_STACK_COUNTERS, SOL_RDS, InfoType
from pyrds.info import counters_dict, parse_info

pytestmark = [pytest.mark.netns, pytest.mark.nft]  # userspace_netns_pair: needs nft too

#: B's messages to A must all arrive within this long after A's re-dial (before the fix: ~15 minutes)
RECOVERY_S = 40.0


def stack_counters(sock: Any) -> dict[str, int]:
    raw = sock.getsockopt(SOL_RDS, PYRDS_INFO_STACK_COUNTERS, 1 << 16)
    return counters_dict(parse_info(InfoType.RDS_INFO_COUNTERS, raw))


def receive_exactly(flows: Sequence[tuple[Any, list[bytes]]], detail: Callable[[], str] = lambda: "") -> None:
    """Each socket of ``flows`` receives its messages, in order, within :data:`RECOVERY_S` of starting on
    it (``detail()`` goes into the failure message); then, socket by socket, nothing more comes within a
    second (nothing twice)."""
    for sock, want in flows:
        got: list[bytes] = []
        deadline = time.monotonic() + RECOVERY_S
        while len(got) < len(want) and time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                got.append(sock.recv(100))
            except TimeoutError:
                break
        assert got == want, f"got {len(got)} of {len(want)} in {RECOVERY_S:g}s: {got!r}{detail()}"
    for sock, _ in flows:
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):  # nothing twice
            extra = sock.recv(100)
            raise AssertionError(f"delivered twice: {extra!r}")


def test_a_redial_replaces_a_path_the_peer_went_silent_on(userspace_netns_pair: Any, tmp_path: Any) -> None:
    na = userspace_netns_pair.a
    a, b = userspace_netns_pair.bound_pair()
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

    def b_counters() -> str:
        counters = stack_counters(b)
        return (
            f"; B's counters tcp_accept_deferred={counters.get('tcp_accept_deferred')} "
            f"tcp_path_silent_dropped={counters.get('tcp_path_silent_dropped')}"
        )

    receive_exactly([(a, sent)], b_counters)  # A gets B's messages
    assert stack_counters(b)["tcp_path_silent_dropped"] >= 1
    a.sendto(b"a-to-b", b.getsockname())  # and the other way on the new connections
    b.settimeout(30)
    assert b.recv(100) == b"a-to-b"


def _set_user_timeout(node: Any, ms: int) -> None:
    kw = {"name": "rds_tcp_user_timeout_ms", "value": ms}
    jid = node.agent.request("job", "pyrds.testing.workloads:userspace_sysctl_set", [], kw)
    node.agent.wait(jid, 60)


def _tx_by_a_port(sock: Any, acceptor: bool) -> dict[int, int]:
    """Bytes sent per RDS/TCP connection of ``sock``'s node, by node A's port of it."""
    rows = sock.get_info(InfoType.RDS_INFO_TCP_SOCKETS)
    return {(r.peer_port if acceptor else r.local_port): r.last_sent_nxt for r in rows}


def _state(na: Any, a: Any, nb: Any, b: Any, ports: str) -> str:
    """What both stacks hold when a black-holed path did not recover: the counters that tell the story,
    their RDS/TCP sockets and the kernel's TCP view of port 16385 in both namespaces (ss)."""
    keys = (
        "tcp_timed_out",
        "tcp_accept_deferred",
        "tcp_path_silent_dropped",
        "tcp_accept_refused_live",
        "tcp_connect_raced",
        "conn_reset",
        "conn_drop",
    )
    out = [f"; cut A ports {{{ports}}}"]
    for name, node, sock in (("A", na, a), ("B", nb, b)):
        counters = stack_counters(sock)
        out.append(f"{name} counters " + " ".join(f"{k}={counters.get(k)}" for k in keys if k in counters))
        rows = sock.get_info(InfoType.RDS_INFO_TCP_SOCKETS)
        out.append(f"{name} RDS/TCP sockets " + ", ".join(f"{r.local_port}->{r.peer_port}" for r in rows))
        ss = node.sh("ss", "-tnoi", "sport = :16385 or dport = :16385", check=False)
        out.append(f"{name} ss:\n{ss.stdout}")
    return "\n".join(out)


def test_a_connection_black_holed_both_ways_is_given_up(userspace_netns_pair: Any, tmp_path: Any) -> None:
    """Both ends of a path keep retransmitting and neither hears the other (seen in CI on one path of the
    host's exactly-once test: both sockets in backoff 8, nothing heard for 76 s, the other paths healthy; a
    stateful middlebox that lost the flow does the same). With data outstanding neither TCP makes a
    keepalive probe and neither stack sees a re-dial, so only TCP_USER_TIMEOUT (``rds_tcp_user_timeout_ms``,
    30 s by default, 3 s here) ends it: the owner's path goes down, it re-dials every path, and every
    message arrives exactly once. With the setting at 0 (TCP's default) nothing arrived in 40 s: it waits
    for tcp_retries2 (~15 minutes)."""
    na, nb = userspace_netns_pair.a, userspace_netns_pair.b
    for node in (na, nb):
        _set_user_timeout(node, 3000)
    a, b = userspace_netns_pair.bound_pair()  # the connections are made after the setting: they carry it
    a_addr, b_addr = a.getsockname(), b.getsockname()
    b.sendto(b"warm-up", a_addr)
    a.settimeout(30)
    assert a.recv(100) == b"warm-up"
    time.sleep(1.5)  # every path is up
    # the paths that carry B->A and A->B (named by A's port): their bytes sent move with one message each
    # way; only they are cut, so the other paths stay healthy and no keepalive ends anything
    before_b, before_a = _tx_by_a_port(b, True), _tx_by_a_port(a, False)
    b.sendto(b"which-path", a_addr)
    assert a.recv(100) == b"which-path"
    a.sendto(b"which-path", b_addr)
    b.settimeout(30)
    assert b.recv(100) == b"which-path"
    after_b, after_a = _tx_by_a_port(b, True), _tx_by_a_port(a, False)
    cut = {p for p, n in after_b.items() if n != before_b.get(p)} | {
        p for p, n in after_a.items() if n != before_a.get(p)
    }
    assert cut and len(after_b) > len(cut), f"paths {sorted(after_b)}, data on {sorted(cut)}"
    ports = ", ".join(str(p) for p in sorted(cut))
    holes = (
        (na, f"tcp dport 16385 tcp sport {{ {ports} }}"),
        (nb, f"tcp sport 16385 tcp dport {{ {ports} }}"),
    )
    for node, match in holes:
        rules = tmp_path / f"hole-{node.name}.nft"
        rules.write_text(
            "table inet pyrds_hole {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
            f"  {match} drop\n }}\n}}\n"
        )
        node.sh("nft", "-f", str(rules))
    to_a = [b"to-a-%d" % i for i in range(10)]
    to_b = [b"to-b-%d" % i for i in range(10)]
    for x, y in zip(to_a, to_b, strict=True):
        b.sendto(x, a_addr)
        a.sendto(y, b_addr)
        time.sleep(0.05)
    receive_exactly([(a, to_a), (b, to_b)], lambda: _state(na, a, nb, b, ports))
    assert stack_counters(a)["tcp_timed_out"] + stack_counters(b)["tcp_timed_out"] >= 1


def test_a_dial_nobody_answers_is_given_up_after_the_user_timeout(
    userspace_netns_pair: Any, tmp_path: Any
) -> None:
    """The owner re-dials and its SYNs go unanswered (a black hole between the nodes). TCP_USER_TIMEOUT,
    set on a connection once it is up, does not bound SYN retries (tcp_syn_retries: over two minutes), so
    before, the path and every message queued for it waited that long. A dial not connected within
    ``rds_tcp_user_timeout_ms`` is given up (``tcp_dial_timed_out``) and re-dialled with the reconnect
    backoff from another port; once the hole is gone the message arrives, once."""
    na, nb = userspace_netns_pair.a, userspace_netns_pair.b
    for node in (na, nb):
        _set_user_timeout(node, 2000)
    rules = tmp_path / "syn.nft"
    rules.write_text(
        "table inet pyrds_syn {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
        "  tcp dport 16385 tcp flags & (syn | ack) == syn drop\n }\n}\n"
    )
    a, b = userspace_netns_pair.bound_pair()
    na.sh("nft", "-f", str(rules))  # from now on A's dials go unanswered
    na.force_reconnect()  # A closes its paths and re-dials them
    a.sendto(b"through-the-hole", b.getsockname())
    deadline = time.monotonic() + 30
    while stack_counters(a)["tcp_dial_timed_out"] == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stack_counters(a)["tcp_dial_timed_out"] >= 1, "no dial was given up in 30 s"
    na.sh("nft", "delete", "table", "inet", "pyrds_syn")
    receive_exactly([(b, [b"through-the-hole"])])
