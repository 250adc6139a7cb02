"""docs/benchmarks.md is what benchmarks/report.py renders from benchmarks/results.json, line for line.

``benchmarks/run.py --merge`` (a run of some sections) re-renders the whole report from the saved results:
anything written into the markdown by hand and not into the JSON is lost at the next partial run (it was:
the notes of three sections, restored by hand in 34b0b5d). A remark on a section belongs in its ``note``
field of results.json; this test fails when the two disagree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.unit.benchlib import bench_modules

ROOT = Path(__file__).resolve().parents[2]


def _without_chart_line(text: str) -> list[str]:
    # the chart's description says whether matplotlib or the stdlib fallback drew it (what is installed
    # here), not what was measured
    return [ln for ln in text.splitlines() if not ln.startswith("![chart]")]


def _committed_results() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    return data


def _render(data: dict[str, Any], tmp_path: Path) -> str:
    """The report benchmarks/report.py writes for ``data`` (its chart into ``tmp_path``)."""
    out = tmp_path / "benchmarks.md"
    with bench_modules(["report"]) as mods:
        mods["report"].write_report(data, out, tmp_path / "benchmarks.png")
    return out.read_text()


def test_committed_report_is_the_rendering_of_committed_results(tmp_path: Path) -> None:
    rendered = _without_chart_line(_render(_committed_results(), tmp_path))
    committed = _without_chart_line((ROOT / "docs" / "benchmarks.md").read_text())
    differing = [
        (i + 1, want, got)
        for i, (want, got) in enumerate(zip(committed, rendered, strict=False))
        if want != got
    ]
    assert len(rendered) == len(committed) and not differing, (
        "docs/benchmarks.md differs from the rendering of benchmarks/results.json (put remarks in the "
        f"sections' note fields): first differences {differing[:3]}"
    )


def test_a_note_in_the_results_reaches_the_report(tmp_path: Path) -> None:
    """The render shows each section's own note (the field this test tells people to use)."""
    data = _committed_results()
    data["floor"]["note"] = "a remark only the floor section has"
    text = _render(data, tmp_path)
    floor = text.split("## Floor", 1)[1].split("\n## ", 1)[0]
    assert "**Note:** a remark only the floor section has" in floor
