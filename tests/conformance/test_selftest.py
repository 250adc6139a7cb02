"""The kernel RDS selftest scenario (tools/testing/selftests/net/rds/test.py, 6.11+), on every backend
pairing.

Two namespaces joined by a veth with tc netem loss/corruption/duplication on both ends; both nodes send
``--rds-messages`` messages (default 2000, the selftest uses 50000) to each other at the same time while
the TCP
connections are force-reset a few times mid-run; a running SHA-256 per (sender, receiver) pair on both sides
proves exactly-once, in-order delivery. Finally every RDS_INFO table is read.
"""

from __future__ import annotations

import errno
import time

import pytest

from pyrds.constants import InfoType
from pyrds.info import counters_dict
from pyrds.testing.topology import NetemUnavailable

NETEM = "loss 5% corrupt 5% duplicate 5%"


@pytest.mark.slow
@pytest.mark.parametrize("impair", ["clean", "netem"])
def test_selftest_exactly_once(rds_two_nodes, rds_message_count, rds_observe, impair):
    nodes = rds_two_nodes
    na, nb = nodes.a, nodes.b
    a, b = na.socket(), nb.socket()
    a.bind((na.addr4, 0))
    b.bind((nb.addr4, 0))
    # bring the connection up before impairing it
    a.sendto(b"hello", b.getsockname())
    b.settimeout(30)
    assert b.recv(10) == b"hello"
    if impair == "netem":
        try:
            nodes.netem(NETEM)
        except NetemUnavailable as exc:
            pytest.skip(str(exc))
    count = rds_message_count
    timeout = 120 + count * 0.05
    ja = na.agent.job(
        "pyrds.testing.workloads:exchange", [a], peers=[b.getsockname()], count=count, seed=7, timeout=timeout
    )
    jb = nb.agent.job(
        "pyrds.testing.workloads:exchange", [b], peers=[a.getsockname()], count=count, seed=7, timeout=timeout
    )
    resets = 0
    for _ in range(3):
        time.sleep(0.5)
        (na if resets % 2 == 0 else nb).force_reconnect()
        resets += 1
    ra = na.agent.wait(ja, timeout + 60)
    rb = nb.agent.wait(jb, timeout + 60)
    nodes.clear_netem()
    ka, kb = ra["me"], rb["me"]
    assert ra["recv_n"] == {kb: count} and rb["recv_n"] == {ka: count}
    assert ra["sent"][kb] == rb["recv"][ka], "A->B digest mismatch: loss, duplicate or reordering"
    assert rb["sent"][ka] == ra["recv"][kb], "B->A digest mismatch: loss, duplicate or reordering"
    counters = counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))
    assert counters["conn_reset"] >= 1
    # like the selftest: every info table can be read after the run
    unreadable = {}
    skip = (
        InfoType.RDS_INFO_IB_CONNECTIONS,
        InfoType.RDS6_INFO_IB_CONNECTIONS,
        InfoType.RDS_INFO_IWARP_CONNECTIONS,
    )
    for t in InfoType:
        if t in skip:
            continue
        try:
            a.get_info(t)
        except OSError as exc:
            unreadable[t.name] = exc.errno
    # Kernel 6.1: RDS_INFO_CONNECTION_STATS has no handler here -> ENOPROTOOPT (the "no handler" rule)
    rds_observe("info_enoprotoopt", sorted(k for k, v in unreadable.items() if v == errno.ENOPROTOOPT))
    assert all(v == errno.ENOPROTOOPT for v in unreadable.values()), unreadable
    rds_observe("delivered", (count, count))
