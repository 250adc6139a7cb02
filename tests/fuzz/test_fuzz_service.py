"""The full-size fuzz of issue 8 (``tox -e fuzz``, 1,000,000 inputs of each kind by default): control
records and RDS/TCP streams against live services, and the same streams fed to PathEngine without sockets.
0 crashes, 0 hangs, the service's pid unchanged and its RSS under fuzzlib.RSS_LIMIT_KB; each test prints
its figures (counts, wall time, rate, max RSS). The quick suite runs the same code with a bounded count
(tests/unit/test_fuzz_quick.py)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.fuzz import fuzzlib

#: a run that would take longer than this stops and fails (bounded in time, never a stuck job)
MAX_SECONDS = 3600.0


def _progress(st: fuzzlib.Stats) -> None:
    if st.batches % 10 == 0:
        print(f"  ... {st.line()}", file=sys.stderr, flush=True)


def test_fuzz_control_records(fuzz_count: int) -> None:
    with fuzzlib.isolated_stack_env():
        st = fuzzlib.fuzz_control(fuzz_count, batch=10_000, max_seconds=MAX_SECONDS, progress=_progress)
    fuzzlib.check(st, fuzz_count)
    assert fuzzlib.control_accounted(st) == st.count


@pytest.mark.netns
def test_fuzz_wire_streams(fuzz_count: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (two network namespaces)")
    pytest.importorskip("pyroute2")
    with fuzzlib.wire_service() as svc:
        st = fuzzlib.fuzz_wire(svc, fuzz_count, batch=20_000, max_seconds=MAX_SECONDS, progress=_progress)
    fuzzlib.check(st, fuzz_count)
    assert st.extra["tcp_protocol_error"] > 0 and st.extra["recv_delivered"] > 0


def test_fuzz_pathengine_feed(fuzz_count: int) -> None:
    st = fuzzlib.fuzz_pathengine(fuzz_count, max_seconds=MAX_SECONDS)
    fuzzlib.check(st, fuzz_count)
