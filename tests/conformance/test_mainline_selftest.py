"""The mainline kernel's RDS selftest (tools/testing/selftests/net/rds/test.py, TCP part) as a scenario, on
every backend pairing, written from its description (:func:`pyrds.testing.workloads.mainline_selftest`).

Two namespaces joined by a veth with netem loss, corruption and duplication on both ends; message n goes from
node n % 2 to node 1 - (n % 3) % 2 (so each node also sends to itself), non-blocking sends in bursts until the
socket pushes back, every received message drained with poll, and after every burst the RDS/TCP buffer
sysctls are rewritten, which drops every RDS/TCP connection of the namespace. A running SHA-256 per (sender,
receiver) pair on both ends proves exactly-once, in-order delivery; then every RDS_INFO option is read with a
1024-byte buffer. ``--rds-mainline-messages`` sets the count (default 5000; the kernel's selftest: 50000);
the overall bound (and the plugin's hang guard) grow with it, a stall (nothing sent or received for STALL_S)
fails at any count. ``--rds-rounds N`` runs it N times per pairing in one session.
"""

from __future__ import annotations

import errno

import pytest

from pyrds.testing.kernelinfo import KernelRace
from pyrds.testing.topology import NetemUnavailable

NETEM = "loss 5% corrupt 5% duplicate 5%"
STALL_S = 60.0
RESET_STORM_RACE = KernelRace(
    "sysctl-reset-storm",
    "RDS/TCP before 7.0 loses, duplicates or stalls when every connection of the namespace is dropped "
    "again and again under netem (accept discards, shutdown drops acked messages, paths swap)",
)


@pytest.mark.slow
def test_mainline_selftest(rds_two_nodes, rds_mainline_count, rds_count_scale, rds_observe, rds_round):
    nodes = rds_two_nodes
    na, nb = nodes.a, nodes.b
    a, b = nodes.bound_pair()
    try:
        nodes.netem(NETEM)
    except NetemUnavailable as exc:
        pytest.skip(str(exc))
    addrs = [a.getsockname(), b.getsockname()]
    count = rds_mainline_count
    timeout = 800.0 * rds_count_scale  # below the hang guard (900 s at 5000 messages, grown as it grows)
    kw = {"addrs": addrs, "count": count, "stall": STALL_S, "timeout": timeout}
    ja = na.agent.job("pyrds.testing.workloads:mainline_selftest", [a], me=0, backend=na.backend, **kw)
    jb = nb.agent.job("pyrds.testing.workloads:mainline_selftest", [b], me=1, backend=nb.backend, **kw)
    race = "kernel" in (na.backend, nb.backend) and RESET_STORM_RACE.present()
    ra = None
    try:
        ra = na.agent.wait(ja, timeout + 30)
        rb = nb.agent.wait(jb, timeout + 30)
    except Exception as exc:
        nodes.report_failure(exc, ra is not None, jb, [a, b])
        if race and nodes.healthy():
            RESET_STORM_RACE.record(False, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        nodes.clear_netem()
    exact = (
        ra["recv_n"] == ra["expect"]
        and rb["recv_n"] == rb["expect"]
        and ra["sent"][1] == rb["recv"][0]
        and rb["sent"][0] == ra["recv"][1]
        and ra["sent"][0] == ra["recv"][0]
        and rb["sent"][1] == rb["recv"][1]
    )
    seen = (
        f"A received {ra['recv_n']} of {ra['expect']}, B received {rb['recv_n']} of {rb['expect']}; "
        f"sysctl rewrites A {ra['resets']} B {rb['resets']}"
    )
    print(seen)
    if race:
        RESET_STORM_RACE.record(exact, seen)
    assert ra["recv_n"] == ra["expect"] and rb["recv_n"] == rb["expect"], seen
    assert ra["sent"][1] == rb["recv"][0], "A->B digest mismatch: loss, duplicate or reordering"
    assert rb["sent"][0] == ra["recv"][1], "B->A digest mismatch: loss, duplicate or reordering"
    assert ra["sent"][0] == ra["recv"][0] and rb["sent"][1] == rb["recv"][1], "self-send digest mismatch"
    assert ra["strangers"] == 0 and rb["strangers"] == 0
    assert ra["resets"] > 0 and rb["resets"] > 0
    # like the selftest, reading every RDS_INFO option with 1024 bytes may only fail for lack of room (ENOSPC)
    # or for a table with no handler (ENOPROTOOPT)
    for r in (ra, rb):
        bad = {k: v for k, v in r["info"].items() if v not in (0, errno.ENOSPC, errno.ENOPROTOOPT)}
        assert not bad, bad
    rds_observe("exactly_once", True)
