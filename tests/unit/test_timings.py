"""``python -m pyrds.testing.timings``: where the main job's time goes, from vm matrix output."""

from __future__ import annotations

import json
from pathlib import Path

from pyrds.testing import timings

JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.conformance.test_cli_two_nodes" name="test_cli[kernel-kernel]" time="60.5"/>
<testcase classname="tests.conformance.test_cli_two_nodes" name="test_cli[userspace-userspace]" time="40.0"/>
<testcase classname="tests.conformance.test_sendrecv" name="test_ordering[kernel]" time="0.5"/>
</testsuite></testsuites>
"""


def _matrix(tmp_path: Path) -> Path:
    m = tmp_path / "guest"
    (m / "7.3").mkdir(parents=True)
    (m / "7.3" / "junit.xml").write_text(JUNIT)
    (m / "6.1").mkdir()  # a kernel whose run left no JUnit
    doc = {
        "kernels": [
            {"alias": "6.1", "release": "6.1.0-56-amd64", "boot_s": 21.0, "wall_s": None},
            {"alias": "7.3", "release": "7.3.4+deb13-amd64", "boot_s": 20.0, "wall_s": 120.0},
        ]
    }
    (m / "matrix.json").write_text(json.dumps(doc))
    return m


def test_sums_and_ranks_per_kernel(tmp_path: Path) -> None:
    kernels = timings.read_matrix(_matrix(tmp_path))
    assert [k.alias for k in kernels] == ["6.1", "7.3"]
    k73 = kernels[1]
    assert k73.tests_s == 101.0 and len(k73.cases) == 3
    assert {c.scenario for c in k73.cases} == {"test_cli_two_nodes::test_cli", "test_sendrecv::test_ordering"}
    text = timings.render(kernels, workers=2)
    # wall 120 - boot 20 - 101/2 = 49.5 s outside tests; 6.1 has no wall figure
    assert "| 7.3 | 7.3.4+deb13-amd64 | 20.0 | 120.0 | 3 | 101.0 | 50.5 | - | 49.5 |" in text
    assert "| 6.1 | 6.1.0-56-amd64 | 21.0 | - | 0 | 0.0 | 0.0 | - | - |" in text
    # scenarios ranked by total time; the one under a second is left out
    assert "| `test_cli_two_nodes::test_cli` | 0.0 | 100.5 |" in text
    assert "test_sendrecv::test_ordering`" not in text.split("## Slowest")[0]
    slow = text.split("## Slowest test cases on 7.3")[1].strip().splitlines()
    assert slow[0].endswith("`test_cli_two_nodes::test_cli[kernel-kernel]`")


def test_cli_writes_file_and_refuses_missing_matrix(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert timings.main(["--matrix", str(_matrix(tmp_path)), "--out", str(out)]) == 0
    assert (out / "conformance-timings.md").read_text().startswith("# Conformance timings")
    assert timings.main(["--matrix", str(tmp_path / "nothing"), "--out", str(out)]) == 1
    assert "matrix.json not found" in capsys.readouterr().err


def test_worker_timelines_from_results_json(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    results = {
        "session_start": 1000.0,
        "session_finish": 1100.0,
        "tests": [
            {"nodeid": "a", "worker": "gw0", "start": 1012.0, "stop": 1040.0},
            {"nodeid": "b", "worker": "gw0", "start": 1045.0, "stop": 1095.0},
            {"nodeid": "c", "worker": "gw1", "start": 1014.0, "stop": 1060.0},
            {"nodeid": "d", "outcome": "skipped"},  # no stamps: not counted
        ],
    }
    (m / "7.3" / "results.json").write_text(json.dumps(results))
    k73 = timings.read_matrix(m)[1]
    gw0, gw1 = k73.workers
    assert (gw0.worker, gw0.tests, gw0.to_first_test, gw0.busy, gw0.gaps, gw0.idle_at_end) == (
        "gw0",
        2,
        12.0,
        78.0,
        5.0,
        5.0,
    )
    assert (gw1.to_first_test, gw1.busy, gw1.gaps, gw1.idle_at_end) == (14.0, 46.0, 0.0, 40.0)
    text = timings.render(timings.read_matrix(m), workers=2)
    assert "| 7.3 | gw1 | 1 | 14.0 | 46.0 | 0.0 | 40.0 |" in text


def test_results_without_stamps_give_no_timeline(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    (m / "7.3" / "results.json").write_text(json.dumps({"tests": [{"nodeid": "a", "outcome": "passed"}]}))
    assert timings.read_matrix(m)[1].workers == ()
    assert "## Worker timelines" not in timings.render(timings.read_matrix(m), workers=2)


IB_JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.conformance.test_ib" name="test_ib_ordering[kernel-kernel]" time="70.25"/>
<testcase classname="tests.conformance.test_ib" name="test_ib_roundtrip[kernel-kernel-0B]" time="2.0"/>
</testsuite></testsuites>
"""


def test_the_ib_phase_has_a_column_and_its_cases_are_ranked(tmp_path: Path) -> None:
    """The RDS/IB session (junit-ib.xml, results-ib.json) is not in the main suite's sum: its wall has a
    column of its own and is left out of the time outside tests; its cases are ranked with the others."""
    m = _matrix(tmp_path)
    (m / "7.3" / "junit-ib.xml").write_text(IB_JUNIT)
    stamps = {"session_start": 5000.0, "session_finish": 5030.0, "tests": []}
    (m / "7.3" / "results-ib.json").write_text(json.dumps(stamps))
    k73 = timings.read_matrix(m)[1]
    assert k73.tests_s == 101.0 and k73.ib_wall_s == 30.0 and len(k73.ib_cases) == 2
    text = timings.render(timings.read_matrix(m), workers=2)
    # wall 120 - boot 20 - 101/2 - IB phase 30 = 19.5 s outside tests
    assert "| 7.3 | 7.3.4+deb13-amd64 | 20.0 | 120.0 | 3 | 101.0 | 50.5 | 30.0 | 19.5 |" in text
    assert "| `test_ib::test_ib_ordering` | 0.0 | 70.2 |" in text
    slow = text.split("## Slowest test cases on 7.3")[1].strip().splitlines()
    assert slow[0].endswith("`test_ib::test_ib_ordering[kernel-kernel]`")
    (m / "7.3" / "results-ib.json").write_text(json.dumps({"tests": []}))  # no stamps: no figure
    assert timings.read_matrix(m)[1].ib_wall_s is None
