"""pyrds.testing.workloads pieces that need no socket: the watchdog and the mainline selftest's pattern."""

from __future__ import annotations

import pytest

from pyrds.testing import workloads
from pyrds.testing.workloads import Watchdog, mainline_plan


def test_watchdog_tells_a_stall_from_a_slow_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(workloads.time, "monotonic", lambda: clock[0])
    dog = Watchdog(timeout=600, stall=45)
    for step in range(20):  # slow but moving: 30 s per message, 600 s in all, never a stall
        clock[0] += 30
        assert dog.why_stop(step) is None
    dog = Watchdog(timeout=600, stall=45)
    assert dog.why_stop(1) is None
    clock[0] += 44
    assert dog.why_stop(1) is None
    clock[0] += 2
    assert dog.why_stop(1) == "stalled: nothing for 45s"
    dog = Watchdog(timeout=10, stall=None)
    clock[0] += 11
    assert dog.why_stop(5) == "not done after 10s"


def test_mainline_pattern() -> None:
    plan = mainline_plan(12)
    assert plan[:6] == [(0, 1), (1, 0), (0, 1), (1, 1), (0, 0), (1, 1)]
    assert plan[6:] == plan[:6]


def test_ranges_names_missing_messages_as_runs() -> None:
    from pyrds.testing.workloads import _ranges

    assert _ranges([5, 1, 2, 3, 9, 10]) == "1-3,5,9-10"
    assert _ranges([]) == ""
    assert _ranges(range(0, 40, 2), limit=3) == "0,2,4,... (17 more runs)"
