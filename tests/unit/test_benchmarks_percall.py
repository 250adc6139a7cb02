"""benchmarks/percall.py's ``floor`` variant (the stdlib socket behind one do-nothing Python function per
data call) passes every call shape through unchanged, and the report shows pyrds.kernel against it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from benchlib import bench_modules


@pytest.fixture(scope="module")
def mods() -> Iterator[dict[str, ModuleType]]:
    with bench_modules(("percall", "report")) as loaded:
        yield loaded


def test_floor_passes_every_call_shape_through(mods: dict[str, ModuleType], monkeypatch: Any) -> None:
    percall = mods["percall"]
    # the host may have no AF_RDS: the floor wraps whatever stdlib socket stdlib_socket gives, here UDP
    udp = lambda version: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # noqa: E731
    monkeypatch.setattr(percall, "stdlib_socket", udp)
    a, b = percall.floor_socket(4), percall.floor_socket(4)
    try:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.settimeout(5)
        dest = b.getsockname()
        assert a.sendto(b"one", dest) == 3
        assert b.recvfrom(100) == (b"one", a.getsockname())
        assert a.sendto(b"two", 0, dest) == 3
        assert b.recvfrom(100, socket.MSG_PEEK) == (b"two", a.getsockname())
        assert b.recvfrom(100, 0)[0] == b"two"
        assert a.sendmsg([b"thr", b"ee"], [], 0, dest) == 5
        data, anc, flags, addr = b.recvmsg(100)
        assert (data, anc, addr) == (b"three", [], a.getsockname())
        for kind in ("sendto", "sendmsg", "reply"):  # every loop of the cases runs (and drains what it sent)
            assert percall.batch(a, b, dest, 16, kind, 3) > 0
        assert {case[3] for case in percall.CASES} == {"sendto", "sendmsg", "reply"}
        a.setblocking(False)
        b.setblocking(False)
        for s in (a, b):
            with pytest.raises(BlockingIOError):
                s.recvfrom(100)
    finally:
        a.close()
        b.close()


def test_report_shows_pyrds_against_the_floor(mods: dict[str, ModuleType]) -> None:
    row = {
        "case": "sendto+recvfrom 0 B v4",
        "stdlib": {"best_us": 10.0, "median_us": 12.0},
        "floor": {"best_us": 11.0, "median_us": 13.0},
        "pyrds.kernel": {"best_us": 11.55, "median_us": 13.0},
    }
    head, _sep, line = mods["report"]._percall_table([row])
    assert head.endswith("| pyrds.kernel / floor |")
    assert line.endswith("| 1.050x (median 1.000x) |")
    assert "1.100x (median 1.083x)" in line  # floor / stdlib


def test_report_says_which_data_calls_pyrds_kernel_ran(mods: dict[str, ModuleType]) -> None:
    report = mods["report"]
    row = {"case": "c", "stdlib": {"best_us": 1.0, "median_us": 1.0}, "pyrds_kernel_calls": "FastCall"}
    assert "C data calls" in report._percall_calls([row])[0]
    assert "Python closures" in report._percall_calls([{**row, "pyrds_kernel_calls": "function"}])[0]
    assert report._percall_calls([{"case": "c"}]) == []  # a run from before the field: nothing claimed
    head, _sep, line = report._percall_table([row])  # the field is not a column
    assert "pyrds_kernel_calls" not in head


def test_a_percall_run_of_its_own_keeps_the_stress_rows(tmp_path: Any) -> None:
    """``run.py --sections percall --merge`` once replaced the stress rows with none (and the chart of no
    rows failed): the stress part stays, and the per-call table says when and where it was measured."""
    import json

    with bench_modules(("run", "report"), ("cells", "ib_section", "topology", "sections", "percall")) as m:
        saved = tmp_path / "results.json"
        old = {"date": "old", "machine": "m", "duration_s": 3.0, "results": [{"scenario": "x"}], "note": "n"}
        saved.write_text(json.dumps({**old, "percall": [{"case": "old"}], "ib": {"rows": ["ib"]}}))
        new = {"date": "new", "machine": "m2", "duration_s": 3.0, "results": [], "percall": [{"case": "new"}]}
        out = m["run"].merge({**new, "note": "quiet"}, saved, ["percall"])
        assert out["results"] == old["results"] and out["date"] == "old" and out["note"] == "n"
        assert out["percall"] == [{"case": "new"}] and out["ib"] == {"rows": ["ib"]}
        assert out["percall_run"] == {"date": "new", "machine": "m2", "note": "quiet"}
        assert m["report"]._percall_run(out["percall_run"]) == [
            "Measured new on m2 (quiet), in a run of its own.",
            "",
        ]
        # the stress rows measured again: the per-call table and its own date stay
        again = m["run"].merge({**new, "results": [{"scenario": "y"}], "percall": []}, tmp_path / "none", [])
        assert again["results"] == [{"scenario": "y"}]
        saved.write_text(json.dumps(out))
        kept = m["run"].merge({**new, "results": [{"scenario": "y"}], "percall": []}, saved, ["stress"])
        assert kept["percall"] == [{"case": "new"}] and kept["percall_run"] == out["percall_run"]
