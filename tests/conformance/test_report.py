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
    assert rep["totals"]["kernel"] == {"passed": 3, "failed": 0, "skipped": 1, "xfailed": 0, "total": 4}


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


# ------------------------------------------------------------------------------------------------ kernels


def _results(path, runs, release=None):
    """Write ``runs`` as the plugin's --rds-results JSON (with ``kernel_release`` when given)."""
    tests = [
        {
            "nodeid": r.nodeid,
            "outcome": r.outcome,
            "reason": r.detail,
            "props": {
                "rds_scenario": r.scenario,
                "rds_backend": r.backend,
                **{f"rds_obs.{k}": v for k, v in r.observations.items()},
            },
        }
        for r in runs
    ]
    data = {"tests": tests} if release is None else {"kernel_release": release, "tests": tests}
    path.write_text(json.dumps(data))
    return path


def _on(kernel, runs):
    return [Run(r.scenario, r.backend, r.outcome, r.nodeid, r.detail, r.observations, kernel) for r in runs]


def _ib(kernel_value, userspace_value, mixed_value=None):
    """One observation scenario on kernel, userspace (and a mixed pairing)."""
    runs = [
        Run("o.py::t_ib", "kernel", "passed", "o.py::t_ib[kernel]", observations={"ib": kernel_value}),
        Run(
            "o.py::t_ib", "userspace", "passed", "o.py::t_ib[userspace]", observations={"ib": userspace_value}
        ),
    ]
    if mixed_value is not None:
        runs.append(
            Run(
                "o.py::t_ib",
                "mixed:kernel-userspace",
                "passed",
                "o.py::t_ib[ku]",
                observations={"ib": mixed_value},
            )
        )
    return runs


def _divs(rep, kernel):
    return {(d["scenario"], d["kind"]): d for d in rep["divergences"] if d["kernel"] == kernel}


def test_columns_per_kernel(tmp_path, capsys):
    """Two kernels' results give backend@alias columns, ordered by version; the alias of a plain --results
    comes from its kernel_release."""
    r61 = _results(tmp_path / "61.json", _runs(), release="6.1.0-56-amd64")
    r73 = _results(tmp_path / "73.json", _runs()[:2], release="7.3.4+deb13-amd64")
    acc = tmp_path / "acc.toml"
    acc.write_text('[[divergence]]\nscenario = "m.py::t_*"\nreason = "known"\n')
    out = tmp_path / "out"
    argv = [
        "--results",
        str(r73),
        "--kernel-results",
        f"6.1={r61}",
        "--accepted",
        str(acc),
        "--out",
        str(out),
    ]
    assert report.main(argv) == 0
    rep = json.loads((out / "conformance-report.json").read_text())
    assert rep["schema"] == 2
    assert rep["kernels"] == {"6.1": "6.1.0-56-amd64", "7.3": "7.3.4+deb13-amd64"}
    assert rep["columns"] == [
        f"{b}@{k}"
        for k in ("6.1", "7.3")
        for b in ("kernel", "userspace", "mixed:kernel-userspace", "mixed:userspace-kernel", "differential")
    ]
    assert rep["scenarios"]["m.py::t_same"] == {
        "kernel@6.1": "passed",
        "userspace@6.1": "passed",
        "kernel@7.3": "passed",
        "userspace@7.3": "passed",
    }
    assert rep["scenarios"]["m.py::t_diff"] == {"kernel@6.1": "passed", "userspace@6.1": "failed"}
    assert rep["totals"]["kernel@6.1"] == {"passed": 3, "failed": 0, "skipped": 1, "xfailed": 0, "total": 4}
    assert rep["totals"]["userspace@7.3"] == {
        "passed": 1,
        "failed": 0,
        "skipped": 0,
        "xfailed": 0,
        "total": 1,
    }
    assert {d["kernel"] for d in rep["divergences"]} == {"6.1"}
    assert {r["kernel"] for r in rep["runs"]} == {"6.1", "7.3"}
    md = (out / "conformance-report.md").read_text()
    assert "| 6.1 | 6.1.0-56-amd64 | 3 pass, 1 skip = 4 |" in md
    assert "| `m.py::t_same` | pass | pass |  |  |  | pass | pass |  |  |  |" in md
    # numeric order, not string order
    assert sorted(["7.3", "6.12", "6.1", "6.2", ""], key=report.kernel_key) == [
        "",
        "6.1",
        "6.2",
        "6.12",
        "7.3",
    ]
    assert report.short_alias("6.12.117+deb13-amd64") == "6.12"


def test_accepted_entry_restricted_to_kernels(tmp_path):
    """``kernels = ["6.1"]``: the same divergence is accepted on 6.1 and unexplained on 7.3."""
    runs = _on("6.1", _ib("'bind'", "'setsockopt'")) + _on("7.3", _ib("'bind'", "'setsockopt'"))
    entry = {"scenario": "o.py::t_ib", "kind": "observation:ib", "kernels": ["6.1"], "reason": "IB"}
    rep = build(runs, [entry])
    d61, d73 = (
        _divs(rep, "6.1")[("o.py::t_ib", "observation:ib")],
        _divs(rep, "7.3")[("o.py::t_ib", "observation:ib")],
    )
    assert (d61["accepted"], d61["reason"], d61["auto"]) == (True, "IB", False)
    assert not d73["accepted"] and rep["unexplained"] == 1
    # without kernels the entry applies everywhere (as before)
    assert build(runs, [{"scenario": "o.py::t_ib", "reason": "IB"}])["unexplained"] == 0
    # the key as written in the toml file, through the CLI
    acc = tmp_path / "acc.toml"
    acc.write_text('[[divergence]]\nscenario = "o.py::t_ib"\nkernels = ["6.1"]\nreason = "IB"\n')
    r61 = _results(tmp_path / "61.json", _ib("'bind'", "'setsockopt'"))
    r73 = _results(tmp_path / "73.json", _ib("'bind'", "'setsockopt'"))
    base = ["--accepted", str(acc), "--out", str(tmp_path / "o"), "--kernel-results", f"6.1={r61}"]
    assert report.main(base) == 0
    assert report.main([*base, "--kernel-results", f"7.3={r73}"]) == 1
    acc.write_text('[[divergence]]\nscenario = "o.py::t_ib"\nkernels = "6.1"\nreason = "IB"\n')
    assert report.main(base) == 2  # kernels must be a list


def test_a_labelled_kernel_is_judged_by_its_releases_line(tmp_path):
    """``PYRDS_KERNELS=patched=IMAGE``: the kernel's alias is the label, but an entry for ``kernels =
    ["7.3"]`` applies when its release is a 7.3 (your patched 7.3 gets Debian 7.3's accepted divergences,
    so what stays unexplained is what your patch changed), and not when it is a 6.12."""
    runs = _on("patched", _ib("'bind'", "'setsockopt'"))
    entry = {"scenario": "o.py::t_ib", "kind": "observation:ib", "kernels": ["7.3"], "reason": "IB"}
    assert build(runs, [entry], {"patched": "7.3.4-dirty"})["unexplained"] == 0
    assert build(runs, [entry], {"patched": "6.12.118-dirty"})["unexplained"] == 1
    assert build(runs, [entry])["unexplained"] == 1  # release unknown: the label alone
    assert build(runs, [{**entry, "kernels": ["patched"]}])["unexplained"] == 0
    # through the CLI: the release comes from the results file
    acc = tmp_path / "acc.toml"
    acc.write_text('[[divergence]]\nscenario = "o.py::t_ib"\nkernels = ["7.3"]\nreason = "IB"\n')
    res = _results(tmp_path / "p.json", _ib("'bind'", "'setsockopt'"), release="7.3.4-dirty")
    assert (
        report.main(
            ["--accepted", str(acc), "--out", str(tmp_path / "o"), "--kernel-results", f"patched={res}"]
        )
        == 0
    )


def test_userspace_following_the_newest_kernel_is_accepted_automatically():
    runs = (
        _on("6.1", _ib("'bind'", "'setsockopt'", "'setsockopt'"))
        + _on("6.12", _ib("'bind'", "'setsockopt'", "'setsockopt'"))
        + _on("7.3", _ib("'setsockopt'", "'setsockopt'", "'setsockopt'"))
        + _on(
            "6.1",
            [
                Run("s.py::t", "kernel", "xfailed", "k", "got 1992 of 2000"),
                Run("s.py::t", "userspace", "passed", "u"),
            ],
        )
        + _on("7.3", [Run("s.py::t", "kernel", "passed", "k"), Run("s.py::t", "userspace", "passed", "u")])
    )
    rep = build(runs, [])
    assert rep["unexplained"] == 0
    for k in ("6.1", "6.12"):
        d = _divs(rep, k)[("o.py::t_ib", "observation:ib")]
        assert d["accepted"] and d["auto"]
        assert d["reason"].startswith(f"userspace follows kernel 7.3; kernel {k} differs")
        assert "'bind'" in d["reason"] and "'setsockopt'" in d["reason"]
    d = _divs(rep, "6.1")[("s.py::t", "outcome")]
    assert d["accepted"] and d["auto"] and "xfailed" in d["reason"] and "passed" in d["reason"]
    assert _divs(rep, "7.3") == {}
    # an entry of the toml file that matches keeps its own reason
    rep = build(runs, [{"scenario": "o.py::t_ib", "kernels": ["6.1"], "reason": "written"}])
    d = _divs(rep, "6.1")[("o.py::t_ib", "observation:ib")]
    assert (d["reason"], d["auto"]) == ("written", False)


def test_no_automatic_acceptance_when_userspace_differs_from_the_newest_kernel_too():
    # userspace shows neither kernel's value
    rep = build(_on("6.1", _ib("'bind'", "'other'")) + _on("7.3", _ib("'setsockopt'", "'other'")), [])
    assert [(d["kernel"], d["accepted"]) for d in rep["divergences"]] == [("6.1", False), ("7.3", False)]
    # userspace follows 7.3 but a mixed pairing does not: every value must
    rep = build(
        _on("6.1", _ib("'bind'", "'setsockopt'", "'bind'")) + _on("7.3", _ib("'setsockopt'", "'setsockopt'")),
        [],
    )
    assert rep["unexplained"] == 1 and not rep["divergences"][0]["auto"]
    # both kernels agree: nothing for userspace to follow
    rep = build(_on("6.1", _ib("'bind'", "'setsockopt'")) + _on("7.3", _ib("'bind'", "'bind'")), [])
    assert rep["unexplained"] == 1
    # no newer kernel present: no rule
    assert build(_on("6.1", _ib("'bind'", "'setsockopt'")), [])["unexplained"] == 1


def test_kernel_vs_kernel_differences_are_listed_and_never_fail(tmp_path):
    same = [
        Run("p.py::t", "kernel", "passed", "k", observations={"mask": "1"}),
        Run("p.py::t", "userspace", "passed", "u", observations={"mask": "1"}),
    ]
    newer = [
        Run("p.py::t", "kernel", "passed", "k", observations={"mask": "2"}),
        Run("p.py::t", "userspace", "passed", "u", observations={"mask": "2"}),
    ]
    fails = [
        Run("f.py::t", "kernel", "failed", "k", "ENOPROTOOPT"),
        Run("f.py::t", "userspace", "failed", "u", "x"),
    ]
    passes = [Run("f.py::t", "kernel", "passed", "k"), Run("f.py::t", "userspace", "passed", "u")]
    rep = build(_on("6.1", same + fails) + _on("6.12", same + passes) + _on("7.3", newer + passes), [])
    assert rep["divergences"] == [] and rep["unexplained"] == 0
    assert rep["kernel_differences"] == [
        {
            "scenario": "f.py::t",
            "kind": "kernels:outcome",
            "results": {"6.1": "failed: ENOPROTOOPT", "6.12": "passed", "7.3": "passed"},
        },
        {
            "scenario": "p.py::t",
            "kind": "kernels:observation:mask",
            "results": {"6.1": "1", "6.12": "1", "7.3": "2"},
        },
    ]
    r61 = _results(tmp_path / "61.json", same + fails, release="6.1.0-56-amd64")
    r73 = _results(tmp_path / "73.json", newer + passes, release="7.3.4+deb13-amd64")
    out = tmp_path / "out"
    acc = tmp_path / "none.toml"
    assert (
        report.main(["--results", str(r61), "--results", str(r73), "--accepted", str(acc), "--out", str(out)])
        == 0
    )
    md = (out / "conformance-report.md").read_text()
    assert "## Kernel vs kernel (2, informational)" in md
    assert "| `p.py::t` | kernels:observation:mask | 1 | 2 |" in md
    assert (
        json.loads((out / "conformance-report.json").read_text())["kernel_differences"][0]["kind"]
        == "kernels:outcome"
    )


def test_missing_or_empty_kernel_results_fail_the_report(tmp_path, capsys):
    good = _results(tmp_path / "61.json", _runs()[:2], release="6.1.0-56-amd64")
    empty = _results(tmp_path / "73.json", [], release="7.3.4+deb13-amd64")
    acc = tmp_path / "none.toml"
    base = ["--accepted", str(acc), "--out", str(tmp_path / "o"), "--kernel-results", f"6.1={good}"]
    assert report.main(base) == 0
    capsys.readouterr()
    assert report.main([*base, "--kernel-results", f"6.12={tmp_path / 'absent.json'}"]) == 1
    assert "kernel 6.12" in capsys.readouterr().err
    rep = json.loads((tmp_path / "o" / "conformance-report.json").read_text())
    assert rep["missing"] == [
        {"kernel": "6.12", "path": str(tmp_path / "absent.json"), "problem": "results file is missing"}
    ]
    assert "6.12" in rep["kernels"] and "kernel@6.12" in rep["columns"]
    assert "NO RESULTS" in (tmp_path / "o" / "conformance-report.md").read_text()
    assert report.main([*base, "--results", str(empty)]) == 1  # alias from its kernel_release
    assert "kernel 7.3" in capsys.readouterr().err
    assert report.main([*base, "--kernel-results", f"7.3={empty}"]) == 1
    (tmp_path / "bad.json").write_text("{not json")
    assert report.main([*base, "--kernel-results", f"7.3={tmp_path / 'bad.json'}"]) == 2
    with pytest.raises(SystemExit) as exc:
        report.main([*base, "--kernel-results", str(good)])  # no ALIAS=
    assert exc.value.code == 2


def test_report_bytes_are_deterministic(tmp_path):
    """Identical outcomes give identical bytes, whatever the order of the inputs and of the tests in them."""
    runs61 = _runs() + _ib("'bind'", "'setsockopt'")
    runs73 = _runs()[:4] + _ib("'setsockopt'", "'setsockopt'")
    acc = tmp_path / "acc.toml"
    acc.write_text('[[divergence]]\nscenario = "m.py::t_obs"\nkernels = ["6.1"]\nreason = "known"\n')
    outputs = []
    for i, order in enumerate([1, 1, -1]):
        a = _results(tmp_path / f"a{i}.json", runs61[::order], release="6.1.0-56-amd64")
        b = _results(tmp_path / f"b{i}.json", runs73[::order], release="7.3.4+deb13-amd64")
        files = [["--kernel-results", f"6.1={a}"], ["--kernel-results", f"7.3={b}"]][::order]
        out = tmp_path / f"out{i}"
        report.main([*files[0], *files[1], "--accepted", str(acc), "--out", str(out)])
        outputs.append(
            ((out / "conformance-report.json").read_bytes(), (out / "conformance-report.md").read_bytes())
        )
    assert outputs[0] == outputs[1] == outputs[2]
    assert b"duration" not in outputs[0][0]


def test_plain_junit_takes_the_kernel_of_its_results(tmp_path):
    """tox's --junit beside --results of the same run: one set of 6.1 columns, no kernel-less duplicates."""
    results = _results(tmp_path / "r.json", _runs()[:2], release="6.1.0-56-amd64")
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="m" name="a">'
        '<properties><property name="rds_scenario" value="m.py::t_same"/>'
        '<property name="rds_backend" value="kernel"/></properties></testcase>'
        '<testcase classname="m" name="x"><properties><property name="rds_scenario" value="m.py::t_more"/>'
        '<property name="rds_backend" value="userspace"/></properties></testcase></testsuite></testsuites>'
    )
    out = tmp_path / "out"
    argv = [
        "--junit",
        str(junit),
        "--results",
        str(results),
        "--accepted",
        str(tmp_path / "n"),
        "--out",
        str(out),
    ]
    assert report.main(argv) == 0
    rep = json.loads((out / "conformance-report.json").read_text())
    assert [r["kernel"] for r in rep["runs"]] == ["6.1", "6.1", "6.1"]
    assert rep["scenarios"]["m.py::t_more"] == {"userspace@6.1": "passed"}


def test_results_json_records_the_kernel_release(tmp_path):
    import platform
    from types import SimpleNamespace

    from pyrds.testing import plugin

    path = tmp_path / "results.json"
    config = SimpleNamespace(getoption=lambda _name: str(path), _pyrds_results={"t": {"nodeid": "t"}})
    plugin.pytest_sessionfinish(SimpleNamespace(config=config))
    data = json.loads(path.read_text())
    assert data["kernel_release"] == platform.release() and data["tests"] == [{"nodeid": "t"}]
    # wall-clock stamps for pyrds.testing.timings' worker timelines (no session start recorded here)
    assert isinstance(data["session_finish"], float) and data["session_start"] is None


def _ib_runs():
    return [
        Run("test_ib.py::t_ib", "kernel", "passed", "i"),
        Run("test_ib.py::t_ib", "mixed:userspace-kernel", "passed", "j"),
    ]


def test_matrix_directory_names_every_kernel(tmp_path, capsys):
    """--matrix DIR reads DIR/<alias>/results.json (the main suite) and results-ib.json (the RDS/IB phase)
    for every kernel of --kernels: a kernel whose guest left nothing, or no IB results, fails the report by
    name, the others get their columns."""
    guest = tmp_path / "guest"
    for alias, release in (("6.1", "6.1.0-56-amd64"), ("7.3", "7.3.4+deb13-amd64")):
        (guest / alias).mkdir(parents=True)
        _results(guest / alias / "results.json", _runs()[:2], release=release)
        _results(guest / alias / "results-ib.json", _ib_runs(), release=release)
    acc = tmp_path / "none.toml"
    args = ["--accepted", str(acc), "--out", str(tmp_path / "o"), "--matrix", str(guest)]
    assert report.main([*args, "--kernels", "6.1,7.3"]) == 0
    rep = json.loads((tmp_path / "o" / "conformance-report.json").read_text())
    assert set(rep["kernels"]) == {"6.1", "7.3"} and "kernel@7.3" in rep["columns"]
    assert rep["scenarios"]["test_ib.py::t_ib"] == {
        f"{b}@{k}": "passed" for b in ("kernel", "mixed:userspace-kernel") for k in ("6.1", "7.3")
    }
    capsys.readouterr()
    assert report.main(args) == 1  # the default matrix includes 6.12, which has no results
    assert "kernel 6.12" in capsys.readouterr().err
    (guest / "7.3" / "results-ib.json").unlink()
    assert report.main([*args, "--kernels", "6.1,7.3"]) == 1
    err = capsys.readouterr().err
    assert "kernel 7.3" in err and "results-ib.json: results file is missing" in err
    assert report.main([*args, "--kernels", "6.1,7.3", "--phases", "results"]) == 0
    with pytest.raises(SystemExit) as bad:
        report.main([*args, "--kernels", "6.1,7.3", "--phases", "../x"])
    assert bad.value.code == 2


def test_matrix_report_asks_for_the_kernels_vm_matrix_planned(tmp_path, capsys):
    """Without --kernels, --matrix DIR asks for what DIR/matrix.json planned (``vm matrix`` writes it before
    the first boot): a kernel of your own under its label gets its column, and one that left nothing fails
    the report by name. A malformed plan is bad input (2)."""
    guest = tmp_path / "guest"
    for alias, release in (("7.3", "7.3.4+deb13-amd64"), ("patched", "7.3.4-dirty")):
        (guest / alias).mkdir(parents=True)
        _results(guest / alias / "results.json", _runs()[:2], release=release)
        _results(guest / alias / "results-ib.json", _ib_runs(), release=release)
    args = ["--accepted", str(tmp_path / "none.toml"), "--out", str(tmp_path / "o"), "--matrix", str(guest)]
    (guest / "matrix.json").write_text(json.dumps({"planned": ["7.3", "patched"], "kernels": []}))
    assert report.main(args) == 0
    rep = json.loads((tmp_path / "o" / "conformance-report.json").read_text())
    assert set(rep["kernels"]) == {"7.3", "patched"} and "kernel@patched" in rep["columns"]
    assert rep["kernels"]["patched"] == "7.3.4-dirty"
    (guest / "matrix.json").write_text(json.dumps({"planned": ["7.3", "patched", "7.4"], "kernels": []}))
    capsys.readouterr()
    assert report.main(args) == 1
    assert "kernel 7.4" in capsys.readouterr().err
    assert report.main([*args, "--kernels", "7.3"]) == 0  # what is asked for by name wins
    for bad in (["../x"], [], "7.3", [7], [".."], ["7.3", "."]):
        (guest / "matrix.json").write_text(json.dumps({"planned": bad, "kernels": []}))
        assert report.main(args) == 2
    (guest / "matrix.json").unlink()
    assert report.main(args) == 1  # no plan: the matrix's three, and 6.1 and 6.12 left nothing


def test_guest_deaths_of_the_matrix_are_reported_and_do_not_fail_it(tmp_path, capsys):
    """A guest that died mid-suite and was booted again (vm matrix's guest-deaths.json) is in the report with
    its console; the report's status is the last boot's results. A malformed record is bad input (2)."""
    guest = tmp_path / "guest"
    (guest / "6.12").mkdir(parents=True)
    _results(guest / "6.12" / "results.json", _runs()[:2], release="6.12.118+deb13-amd64")
    _results(guest / "6.12" / "results-ib.json", _ib_runs(), release="6.12.118+deb13-amd64")
    death = {
        "attempt": 1,
        "wall_s": 220.4,
        "kernel_crash": True,
        "console_tail": ["[ 171.2] BUG: kernel NULL pointer dereference", "[ 171.3] Kernel panic"],
        "messages": ["guest A reported no exit status"],
    }
    (guest / "6.12" / "guest-deaths.json").write_text(json.dumps({"deaths": [death]}))
    args = ["--accepted", str(tmp_path / "none.toml"), "--out", str(tmp_path / "o"), "--matrix", str(guest)]
    assert report.main([*args, "--kernels", "6.12"]) == 0
    assert "guest death: kernel 6.12, attempt 1: a kernel crash" in capsys.readouterr().out
    rep = json.loads((tmp_path / "o" / "conformance-report.json").read_text())
    (got,) = rep["guest_deaths"]
    assert got["kernel"] == "6.12" and got["kernel_crash"] is True
    assert got["console_tail"][-1].endswith("Kernel panic")
    md = (tmp_path / "o" / "conformance-report.md").read_text()
    assert "## Guest deaths (1)" in md and "**kernel crash**" in md and "NULL pointer dereference" in md
    (guest / "6.12" / "guest-deaths.json").write_text(json.dumps({"deaths": [{"wall_s": 1}]}))
    assert report.main([*args, "--kernels", "6.12"]) == 2
    (guest / "6.12" / "guest-deaths.json").unlink()
    assert report.main([*args, "--kernels", "6.12"]) == 0
    rep = json.loads((tmp_path / "o" / "conformance-report.json").read_text())
    assert rep["guest_deaths"] == []
    assert "Guest deaths" not in (tmp_path / "o" / "conformance-report.md").read_text()
