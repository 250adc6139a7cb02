"""The report command itself: divergence detection, accepted divergences, exit status."""

from __future__ import annotations

import json

import pytest

from pyrds.testing import report
from pyrds.testing.report import Run, build


def _runs():
    return [
        Run("m.py::t_same", "kernel", "passed", "a"),
        Run("m.py::t_same", "userspace", "passed", "b"),
        Run("m.py::t_diff", "kernel", "passed", "c"),
        Run("m.py::t_diff", "userspace", "failed", "d", "assert 1 == 2"),
        Run("m.py::t_obs", "kernel", "passed", "e", observations={"mask": "['POLLOUT']"}),
        Run("m.py::t_obs", "userspace", "passed", "f", observations={"mask": "['POLLIN']"}),
        Run("m.py::t_skip", "kernel", "skipped", "g", "no AF_RDS"),
        Run("m.py::t_skip", "userspace", "failed", "h"),
    ]


def test_divergences_found_and_skips_not_compared():
    rep = build(_runs(), [])
    kinds = {(d["scenario"], d["kind"]) for d in rep["divergences"]}
    assert kinds == {("m.py::t_diff", "outcome"), ("m.py::t_obs", "observation:mask")}
    assert rep["unexplained"] == 2
    assert rep["totals"]["kernel"] == {"passed": 3, "skipped": 1}


def test_accepted_divergence():
    rep = build(_runs(), [{"scenario": "m.py::t_obs", "reason": "documented"}])
    acc = [d for d in rep["divergences"] if d["accepted"]]
    assert [d["scenario"] for d in acc] == ["m.py::t_obs"] and acc[0]["reason"] == "documented"
    assert rep["unexplained"] == 1


def test_main_exit_status(tmp_path):
    results = tmp_path / "r.json"
    tests = [
        {
            "nodeid": r.nodeid,
            "outcome": r.outcome,
            "props": {
                "rds_scenario": r.scenario,
                "rds_backend": r.backend,
                **{f"rds_obs.{k}": v for k, v in r.observations.items()},
            },
        }
        for r in _runs()
    ]
    results.write_text(json.dumps({"tests": tests}))
    accepted = tmp_path / "acc.toml"
    accepted.write_text("")
    assert report.main(["--results", str(results), "--accepted", str(accepted), "--out", str(tmp_path)]) == 1
    accepted.write_text('[[divergence]]\nscenario = "m.py::t_*"\nreason = "known"\n')
    assert report.main(["--results", str(results), "--accepted", str(accepted), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "conformance-report.md").read_text()
    assert "ACCEPTED: known" in md and "| `m.py::t_same` | pass | pass |" in md


def _item(nodeid, params):
    from types import SimpleNamespace

    name = nodeid.split("::")[-1]
    return SimpleNamespace(
        nodeid=nodeid,
        name=name,
        originalname=name.split("[")[0],
        callspec=SimpleNamespace(params=params),
        get_closest_marker=lambda _name: None,
    )


@pytest.mark.parametrize(
    ("pair", "label"),
    [
        ("kernel-kernel", "kernel"),
        ("userspace-userspace", "userspace"),
        ("kernel-userspace", "mixed:kernel-userspace"),
    ],
)
def test_two_node_scenarios_share_one_name_across_pairings(pair, label):
    """A same-backend pair's id has the backend twice ("kernel-kernel"): both words go, or its rows never
    line up with the mixed pairings and nothing is compared."""
    from pyrds.testing.plugin import _labels_of

    sel = _item(
        f"tests/conformance/test_selftest.py::test_selftest_exactly_once[{pair}-netem]",
        {"_rds_topology": pair, "impair": "netem"},
    )
    assert _labels_of(sel) == ("test_selftest.py::test_selftest_exactly_once[netem]", label)
    plain = _item(f"tests/conformance/test_two_nodes.py::test_tcp_roundtrip[{pair}]", {"_rds_topology": pair})
    assert _labels_of(plain) == ("test_two_nodes.py::test_tcp_roundtrip", label)


def test_xfail_reason_reaches_the_results():
    """An xfail's message (e.g. how many messages arrived) is kept for the report, not just 'xfailed'."""
    from types import SimpleNamespace

    from pyrds.testing import plugin

    config = SimpleNamespace(_pyrds_results={})
    saved = getattr(plugin.pytest_runtest_logreport, "_config", None)  # this very run may be recording
    plugin.pytest_runtest_logreport._config = config
    try:
        rep = SimpleNamespace(
            nodeid="t.py::x[kernel]",
            user_properties=[("rds_backend", "kernel")],
            failed=False,
            skipped=True,
            wasxfail="reason: received 1992 of 2000",
            when="call",
            duration=0.5,
            longrepr=None,
        )
        plugin.pytest_runtest_logreport(rep)
    finally:
        plugin.pytest_runtest_logreport._config = saved
    entry = config._pyrds_results["t.py::x[kernel]"]
    assert entry["outcome"] == "xfailed" and "1992 of 2000" in entry["reason"]


def test_failed_differential_machine_is_an_unexplained_divergence():
    runs = [
        Run("test_differential.py::test_differential", "differential", "failed", "n", "kernel ok, us err")
    ]
    rep = build(runs, [])
    assert [(d["scenario"], d["kind"]) for d in rep["divergences"]] == [
        ("test_differential.py::test_differential", "differential")
    ]
    assert rep["unexplained"] == 1
    assert (
        build([Run("test_differential.py::test_differential", "differential", "passed", "n")], [])[
            "unexplained"
        ]
        == 0
    )
