"""The fuzz of issue 8 with a bounded count, in the quick suite (the full million: ``tox -e fuzz``,
tests/fuzz/). Same drivers (tests/fuzz/fuzzlib.py): random and mutated control records against a live,
isolated service; random and mutated RDS/TCP streams over real TCP from a second network namespace; the same
streams fed to PathEngine. 0 crashes, 0 hangs, the same service pid, RSS under the bound."""

from __future__ import annotations

import os

import pytest

from pyrds.userspace import rpc
from tests.fuzz import fuzzlib

CONTROL = 10_000
WIRE = 10_000
PATHENGINE = 50_000


def test_fuzz_control_records_quick() -> None:
    with fuzzlib.isolated_stack_env():
        st = fuzzlib.fuzz_control(CONTROL, seed=1, batch=2_500, max_seconds=60)
    fuzzlib.check(st, CONTROL)
    assert fuzzlib.control_accounted(st) == st.count


def test_a_consumed_notice_without_reply_is_not_waited_for() -> None:
    """The full run (tox -e fuzz, 2026-12-08) reported a hang at record 720,475: a well-formed CONSUMED
    (03 00000000 00 00) with ``reply`` 0, which the service rightly leaves unanswered. Notices are judged as
    the service assembles them (a record after one whose last packet said MORE is joined to it)."""
    rec = bytes.fromhex("03000000000000")
    assert fuzzlib.notice_kind(rec) == "consumed_notices"
    assert fuzzlib.notice_kind(rpc.CONSUMED.pack(rpc.TAG_CONSUMED, 2, 1, 0, 7)) == "consumed_notices"
    assert fuzzlib.notice_kind(rpc.CONSUMED.pack(rpc.TAG_CONSUMED, 2, 1, 1, 7)) is None  # reply asked for
    assert fuzzlib.notice_kind(rec + b"\0") is None  # malformed: the service drops the connection
    assert fuzzlib.notice_kind(bytes([rpc.TAG_POST]) + b"anything") == "posts"
    assert fuzzlib.notice_kind(b"") is None


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
