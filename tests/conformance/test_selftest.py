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
from pyrds.testing.kernelinfo import KernelRace
from pyrds.testing.topology import NetemUnavailable

NETEM = "loss 5% corrupt 5% duplicate 5%"
STALL_S = 45.0

# Observed in the 6.1 guest (2026-11-23): kernel<->kernel RDS/TCP under this netem with forced reconnects
# delivers duplicates in some runs (686 and 616 of 500 received) or stalls (476 of 500), with the pre-pyroute2
# topology as well: 6.1 (and 6.12, which lacks the same 7.0 fixes) is not exactly-once here. 7.3 was exact.
NETEM_RACE = KernelRace(
    "netem-resets",
    "RDS/TCP before 7.0 is not exactly-once under netem loss/corrupt/duplicate with forced reconnects "
    "(accept discards, paths swap across reconnects, shutdown drops acked messages)",
)
# A pyrds owner dials a pre-7.0 acceptor's paths in order, one at a time, each confirmed before the next, but
# nothing on the wire names a path: a kernel-side reset that lands while the owner is still dialling hands the
# in-flight connection to whichever kernel path is free first, and messages then cross sequence spaces. Seen
# in the 6.1 guest (2026-11-23): 1 or 2 duplicates, in about 1 of 15 clean rounds of this pairing. 7.x
# acceptors take the path from the source port (RDS_EXTHDR_SPORT_IDX), so there it is strict.
ACCEPTOR_RACE = KernelRace(
    "acceptor-path-race",
    "pre-7.0 acceptor: a reset racing the owner's ordered multipath dials can cross paths",
)

# kernel<->kernel without impairment, 3 forced reconnects: a fresh-clone CI run on 6.1 (2026-11-24) stalled
# with B at 1628 of 2000 and A's sends refused with ENOBUFS 578 times (a congested bit that never cleared);
# the same scenario had passed in every earlier matrix run. No userspace code is on that path. Another pair
# that shares an address produces the same symptom (the kernel's congestion maps are per address for the
# whole host: docs/kernel-vs-facts.md row 19), and the two xdist workers' pairs could share one until
# 2026-11-28 (pyrds.testing.topology.pair_addresses); that may have been the cause. Kept until runs show it.
RESET_RACE = KernelRace(
    "reset-stall",
    "RDS/TCP before 7.0 can stall or lose across forced reconnects even without impairment "
    "(6.1 kernel<->kernel: 1628 of 2000 received, the sender on ENOBUFS)",
)


@pytest.mark.slow
@pytest.mark.parametrize("impair", ["clean", "netem"])
def test_selftest_exactly_once(
    rds_two_nodes, rds_message_count, rds_count_scale, rds_observe, rds_round, impair
):
    nodes = rds_two_nodes
    na, nb = nodes.a, nodes.b
    a, b = nodes.bound_pair()  # the connection is up before it is impaired
    if impair == "netem":
        try:
            nodes.netem(NETEM)
        except NetemUnavailable as exc:
            pytest.skip(str(exc))
    count = rds_message_count
    # a stall (no message sent or received for STALL_S) ends the exchange; a slow but moving run never does
    # (how busy the machine is must not decide the outcome). The overall bound stays below --rds-timeout; both
    # grow with the count by the same factor (rds_count_scale).
    timeout = 600.0 * rds_count_scale
    kw = {"count": count, "seed": 7, "timeout": timeout, "stall": STALL_S}
    ja = na.agent.job("pyrds.testing.workloads:exchange", [a], peers=[b.getsockname()], **kw)
    jb = nb.agent.job("pyrds.testing.workloads:exchange", [b], peers=[a.getsockname()], **kw)
    resets = 0
    for _ in range(3):
        time.sleep(0.5)
        (na if resets % 2 == 0 else nb).force_reconnect()
        resets += 1
    kernel_involved = "kernel" in (na.backend, nb.backend)
    netem_race = impair == "netem" and kernel_involved and NETEM_RACE.present()
    acceptor_race = (na.backend, nb.backend) == ("userspace", "kernel") and ACCEPTOR_RACE.present()
    reset_race = (na.backend, nb.backend) == ("kernel", "kernel") and RESET_RACE.present()
    race = (
        NETEM_RACE if netem_race else ACCEPTOR_RACE if acceptor_race else RESET_RACE if reset_race else None
    )
    ra = None
    try:
        ra = na.agent.wait(ja, timeout + 15)
        rb = nb.agent.wait(jb, timeout + 15)
    except Exception as exc:
        nodes.report_failure(exc, ra is not None, jb, [a, b])
        if race is not None and nodes.healthy():
            race.record(False, f"{type(exc).__name__}: {exc}")
        raise
    nodes.clear_netem()
    ka, kb = ra["me"], rb["me"]
    exact = (
        ra["recv_n"] == {kb: count}
        and rb["recv_n"] == {ka: count}
        and ra["sent"][kb] == rb["recv"][ka]
        and rb["sent"][ka] == ra["recv"][kb]
    )
    seen = f"received A {ra['recv_n']} / B {rb['recv_n']} of {count}"
    for node, r in ((na, ra), (nb, rb)):  # where the time went (pauses >= 1 s: (start s, length s, mark))
        print(
            f"{node.name} {node.backend} {r['me']}: {r['elapsed_s']} s, sends refused {r['refusals']}, "
            f"pauses {r['pauses']}"
        )
    if race is not None:
        race.record(exact, seen)
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
