"""The benchmark's targets section: each pass's ratio is against the stdlib kernel row of the same pass, the
verdict uses the median over the passes, and each mixed pairing is judged against the userspace<->userspace
median of its cell (a single 3 s cell swung 0.44x-0.54x between two runs of one day, so one pass decides
nothing)."""

from __future__ import annotations

from typing import Any

from tests.unit.benchlib import bench_modules

BASE = "kernel<->kernel (stdlib)"
UU = "userspace<->userspace"


def _rows(cell: tuple[str, int], rates: dict[str, list[float]]) -> list[dict[str, Any]]:
    mode, size = cell
    return [
        {"scenario": sc, "mode": mode, "size": size, "rep": rep, "msgs_per_s": rate, "error": None}
        for sc, per_rep in rates.items()
        for rep, rate in enumerate(per_rep)
    ]


def test_ratios_are_per_pass_and_the_verdict_is_their_median() -> None:
    with bench_modules(["report"]) as mods:
        report = mods["report"]
        rows = _rows(
            ("rr", 1024),
            {
                BASE: [1000.0, 500.0, 800.0],
                # 0.20, 0.30, 0.26 per pass: median 0.26 (met); against the mean base rate it would be 0.25
                UU: [200.0, 150.0, 208.0],
                "userspace->kernel": [250.0, 120.0, 200.0],  # 0.25, 0.24, 0.25: median 0.25 < 0.26
                "kernel->userspace": [400.0, 200.0, 320.0],  # 0.40 each
            },
        )
        got = {v["scenario"]: v for v in report.target_verdicts(rows)}
        uu = got[UU]
        assert [round(x, 2) for x in uu["ratios"]] == [0.2, 0.3, 0.26]
        assert round(uu["median"], 2) == 0.26 and uu["target"] == 0.25 and uu["met"] is True
        u2k = got["userspace->kernel"]
        assert u2k["target"] == uu["median"] and u2k["met"] is False
        assert got["kernel->userspace"]["met"] is True
        assert BASE not in got


def test_one_way_64k_target_and_failed_cells() -> None:
    with bench_modules(["report"]) as mods:
        report = mods["report"]
        rows = _rows(("oneway", 65536), {BASE: [1000.0, 1000.0], UU: [490.0, 480.0]})
        rows.append(
            {"scenario": UU, "mode": "oneway", "size": 65536, "rep": 2, "msgs_per_s": None, "error": "rc 1"}
        )
        (uu,) = report.target_verdicts(rows)
        assert uu["target"] == 0.5 and uu["met"] is False and len(uu["ratios"]) == 2
        text = "\n".join(
            report._targets_section({"date": "d", "machine": "m", "seconds": 5, "repeat": 3, "rows": rows})
        )
        assert (
            "| one-way 64 KiB | userspace<->userspace | 490, 480 | 0.49x, 0.48x | 0.48x | >= 0.50x | **no** |"
            in text
        )
        assert "Failed cells: 1 (rc 1)." in text
        assert "Not measured" in "\n".join(report._targets_section(None))


def test_a_cell_whose_baseline_failed_in_every_pass_is_still_shown() -> None:
    with bench_modules(["report"]) as mods:
        report = mods["report"]
        rows = _rows(("rr", 1024), {UU: [120.0]})
        rows.append(
            {"scenario": BASE, "mode": "rr", "size": 1024, "rep": 0, "msgs_per_s": None, "error": "rc 2"}
        )
        text = "\n".join(
            report._targets_section({"date": "d", "machine": "m", "seconds": 5, "repeat": 1, "rows": rows})
        )
        assert f"| request/response 1 KiB | {BASE} | - | 1.00x | - | - | - |" in text
        assert "| request/response 1 KiB | userspace<->userspace | 120 |  | - | >= 0.25x | - |" in text


def test_a_run_without_stress_rows_writes_no_chart(tmp_path: Any) -> None:
    """--sections targets (or percall, ...) without --merge: no stress rows. The chart used to raise
    (matplotlib: 'Number of columns must be a positive integer, not 0'; the stdlib chart drew nothing)."""
    with bench_modules(["report"]) as mods:
        report = mods["report"]
        png = tmp_path / "b.png"
        png.write_bytes(b"last run's chart")
        how = report.write_chart([], png)
        assert "no chart" in how
        assert png.read_bytes() == b"last run's chart"


def test_a_merged_run_without_stress_rows_keeps_the_chart_and_what_drew_it(tmp_path: Any) -> None:
    """``run.py --sections targets --merge`` on a host without matplotlib replaced the committed chart with
    the stdlib fallback's (and its description): the stress rows it drew were not measured again."""
    import json

    with bench_modules(("run", "report"), ("cells", "ib_section", "topology", "sections", "percall")) as m:
        saved = tmp_path / "results.json"
        rows = [
            {"scenario": "s", "mode": "rr", "size": 1024, "msgs_per_s": 10.0, "mb_per_s": 0.01, "p50_us": 1.0}
            | {"p99_us": 2.0, "cpu_pct": 3.0, "error": None}
        ]
        old = {"date": "old", "machine": "m", "duration_s": 3.0, "results": rows, "chart": "drawn by X"}
        saved.write_text(json.dumps(old))
        new = {"date": "new", "machine": "m2", "duration_s": 3.0, "results": []}
        out = m["run"].merge(new, saved, ["targets"])
        assert out["chart"] == "drawn by X" and out["results"] == rows
        png, md = tmp_path / "b.png", tmp_path / "b.md"
        png.write_bytes(b"last run's chart")
        m["report"].write_report(out, md, png, chart=False)
        assert png.read_bytes() == b"last run's chart"
        assert "![chart](b.png) - drawn by X" in md.read_text().splitlines()
        # the stress rows measured: drawn again, and described as drawn
        m["report"].write_report(out, md, png)
        assert png.read_bytes() != b"last run's chart" and out["chart"] != "drawn by X"
        assert f"![chart](b.png) - {out['chart']}" in md.read_text().splitlines()
