"""The fuzz of issue 8 with a bounded count, in the quick suite (the full million: ``tox -e fuzz``,
tests/fuzz/). Same drivers (tests/fuzz/fuzzlib.py): random and mutated control records against a live,
isolated service; random and mutated RDS/TCP streams over real TCP from a second network namespace; the same
streams fed to PathEngine. 0 crashes, 0 hangs, the same service pid, RSS under the bound."""

from __future__ import annotations

import os

import pytest

from tests.fuzz import fuzzlib

CONTROL = 10_000
WIRE = 10_000
PATHENGINE = 50_000


def test_fuzz_control_records_quick() -> None:
    with fuzzlib.isolated_stack_env():
        st = fuzzlib.fuzz_control(CONTROL, seed=1, batch=2_500, max_seconds=60)
    fuzzlib.check(st, CONTROL)
    assert st.answered + st.dropped + st.extra.get("incomplete", 0) + st.extra.get("posts", 0) == st.count


@pytest.mark.netns
def test_fuzz_wire_streams_quick() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (two network namespaces)")
    pytest.importorskip("pyroute2")
    with fuzzlib.wire_service(subnet="10.89.0") as svc:
        st = fuzzlib.fuzz_wire(svc, WIRE, seed=1, batch=2_500, max_seconds=60)
    fuzzlib.check(st, WIRE)
    assert st.extra["tcp_protocol_error"] > 0 and st.extra["recv_delivered"] > 0


def test_fuzz_pathengine_feed_quick() -> None:
    st = fuzzlib.fuzz_pathengine(PATHENGINE, seed=1, max_seconds=60)
    fuzzlib.check(st, PATHENGINE)
