"""Conformance report: scenario x backend table, totals, divergences (``python -m pyrds.testing.report``).

Input: pytest JUnit XML (``--junit``, repeatable) whose test cases carry the plugin's properties
``rds_scenario``, ``rds_backend`` and ``rds_obs.*``; and/or the plugin's ``--rds-results`` JSON
(``--results``).
Output (``--out DIR``): ``conformance-report.md``, ``conformance-report.json`` and a copy of each JUnit file
(``conformance-junit[-N].xml``).

A divergence is a scenario whose non-skipped runs on different backends differ in outcome (passed vs
failed) or
in a recorded observation. Accepted divergences are listed, with a reason each, in ONE file
(``tests/conformance/accepted-divergences.toml``: ``[[divergence]] scenario = "glob" backends = [...]
reason = "..."``). Exit status: 0 when every divergence is accepted, 1 otherwise (2 on bad input).
Skipped is never counted as passed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COLUMNS = ["kernel", "userspace", "mixed:kernel-userspace", "mixed:userspace-kernel", "differential"]
GROUPS = {
    "kernel": "kernel",
    "userspace": "userspace",
    "mixed:kernel-userspace": "mixed",
    "mixed:userspace-kernel": "mixed",
    "differential": "differential",
}
SYMBOL = {"passed": "pass", "failed": "FAIL", "skipped": "skip", "xfailed": "xfail", "error": "ERROR"}
DEFAULT_ACCEPTED = Path("tests/conformance/accepted-divergences.toml")


@dataclass
class Run:
    scenario: str
    backend: str
    outcome: str
    nodeid: str
    detail: str = ""
    observations: dict[str, str] = field(default_factory=dict)


@dataclass
class Divergence:
    scenario: str
    kind: str  # "outcome", "observation:<key>" or "differential" (the differential machine failed)
    results: dict[str, str]
    accepted: bool = False
    reason: str = ""


def _junit_runs(path: Path) -> list[Run]:
    runs: list[Run] = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        if "rds_scenario" not in props:
            continue
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}[tag]
                if tag == "skipped" and (el.get("type") == "pytest.xfail"):
                    outcome = "xfailed"
                detail = (el.get("message") or _summary(el.text or ""))[:500]
                if tag != "skipped":
                    break
        nodeid = f"{case.get('classname', '')}::{case.get('name', '')}"
        obs = {k[len("rds_obs.") :]: v for k, v in props.items() if k.startswith("rds_obs.")}
        runs.append(Run(props["rds_scenario"], props["rds_backend"], outcome, nodeid, detail, obs))
    return runs


def _summary(longrepr: str) -> str:
    """The ``E   ...`` lines of a pytest failure (what was asserted and seen), else its last line."""
    lines = [ln[1:].strip() for ln in longrepr.splitlines() if ln.startswith("E ")]
    if not lines:
        lines = [ln for ln in longrepr.splitlines() if ln.strip()][-1:]
    return " / ".join(lines[:4])


def _json_runs(path: Path) -> list[Run]:
    data = json.loads(path.read_text())
    runs: list[Run] = []
    for t in data.get("tests", []):
        props = t.get("props", {})
        if "rds_scenario" not in props:
            continue
        obs = {k[len("rds_obs.") :]: v for k, v in props.items() if k.startswith("rds_obs.")}
        detail = t.get("reason") or _summary(t.get("longrepr", ""))
        runs.append(
            Run(
                props["rds_scenario"], props["rds_backend"], t["outcome"], t["nodeid"], str(detail)[:500], obs
            )
        )
    return runs


def load_accepted(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text())
    entries: list[dict[str, Any]] = data.get("divergence", [])
    for e in entries:
        if not e.get("scenario") or not e.get("reason"):
            raise ValueError(f"{path}: every [[divergence]] needs 'scenario' and 'reason': {e}")
    return entries


def find_divergences(runs: list[Run], accepted: list[dict[str, Any]]) -> list[Divergence]:
    by_scenario: dict[str, dict[str, Run]] = defaultdict(dict)
    for r in runs:
        by_scenario[r.scenario][r.backend] = r
    out: list[Divergence] = []
    for scenario, cols in sorted(by_scenario.items()):
        diff = cols.get("differential")
        if diff is not None and diff.outcome == "failed":
            # the differential machine runs both backends itself: its failure IS a divergence
            out.append(Divergence(scenario, "differential", {"differential": diff.detail}))
        ran = {b: r for b, r in cols.items() if r.outcome not in ("skipped",)}
        if len(ran) >= 2 and len({r.outcome for r in ran.values()}) > 1:
            out.append(
                Divergence(
                    scenario, "outcome", {b: f"{r.outcome}: {r.detail}".strip(": ") for b, r in ran.items()}
                )
            )
        keys = sorted({k for r in ran.values() for k in r.observations})
        for key in keys:
            seen = {b: r.observations[key] for b, r in ran.items() if key in r.observations}
            if len(seen) >= 2 and len(set(seen.values())) > 1:
                out.append(Divergence(scenario, f"observation:{key}", seen))
    for d in out:
        for e in accepted:
            if not fnmatch.fnmatchcase(d.scenario, e["scenario"]):
                continue
            if "kind" in e and not fnmatch.fnmatchcase(d.kind, e["kind"]):
                continue
            wanted = set(e.get("backends", []))
            if wanted and not wanted & set(d.results):
                continue
            d.accepted, d.reason = True, str(e["reason"])
            break
    return out


def build(runs: list[Run], accepted: list[dict[str, Any]]) -> dict[str, Any]:
    scenarios: dict[str, dict[str, str]] = defaultdict(dict)
    totals: dict[str, Counter[str]] = {g: Counter() for g in ("kernel", "userspace", "mixed", "differential")}
    for r in runs:
        scenarios[r.scenario][r.backend] = r.outcome
        totals[GROUPS.get(r.backend, "mixed")][r.outcome] += 1
    divs = find_divergences(runs, accepted)
    return {
        "columns": COLUMNS,
        "scenarios": {k: scenarios[k] for k in sorted(scenarios)},
        "totals": {g: dict(c) for g, c in totals.items()},
        "divergences": [asdict(d) for d in divs],
        "unexplained": sum(1 for d in divs if not d.accepted),
        "runs": [asdict(r) for r in runs],
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def render_md(rep: dict[str, Any]) -> str:
    lines = ["# pyrds conformance report", ""]
    lines.append(
        "Outcome per scenario and backend (kernel = native AF_RDS, userspace = pyrds stack, mixed = node A "
        "/ node B backends over RDS/TCP between two namespaces). Skipped is never counted as passed."
    )
    lines += [
        "",
        "## Totals",
        "",
        "| backend | passed | failed | skipped | xfailed | total |",
        "|---|---|---|---|---|---|",
    ]
    for g, c in rep["totals"].items():
        tot = sum(c.values())
        lines.append(
            f"| {g} | {c.get('passed', 0)} | {c.get('failed', 0)} | {c.get('skipped', 0)} | "
            f"{c.get('xfailed', 0)} | {tot} |"
        )
    divs = rep["divergences"]
    lines += ["", f"## Divergences ({len(divs)}, unexplained: {rep['unexplained']})", ""]
    if not divs:
        lines.append("None.")
    for d in divs:
        status = f"ACCEPTED: {d['reason']}" if d["accepted"] else "**UNEXPLAINED**"
        lines += [
            f"### `{d['scenario']}` ({d['kind']}) - {status}",
            "",
            "| backend | observed |",
            "|---|---|",
        ]
        for b, v in sorted(d["results"].items()):
            lines.append(f"| {b} | {_cell(v)} |")
        lines.append("")
    lines += [
        "",
        "## Scenario x backend",
        "",
        "| scenario | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for name, cols in rep["scenarios"].items():
        cells = [SYMBOL.get(cols[c], cols[c]) if c in cols else "" for c in COLUMNS]
        lines.append(f"| `{_cell(name)}` | " + " | ".join(cells) + " |")
    skips = Counter(r["detail"] for r in rep["runs"] if r["outcome"] == "skipped")
    if skips:
        lines += ["", "## Skip reasons", "", "| count | reason |", "|---|---|"]
        for reason, n in skips.most_common():
            lines.append(f"| {n} | {_cell(reason)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyrds.testing.report", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--junit", action="append", default=[], type=Path, help="pytest --junitxml file (repeatable)"
    )
    ap.add_argument("--results", action="append", default=[], type=Path, help="pytest --rds-results JSON")
    ap.add_argument("--accepted", type=Path, default=DEFAULT_ACCEPTED)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    if not args.junit and not args.results:
        ap.error("give at least one --junit or --results file")
    runs: list[Run] = []
    for p in args.results:
        runs += _json_runs(p)
    seen = {(r.nodeid.split("::")[-1], r.scenario, r.backend) for r in runs}
    for p in args.junit:
        for r in _junit_runs(p):
            if (r.nodeid.split("::")[-1], r.scenario, r.backend) not in seen:
                runs.append(r)
    try:
        accepted = load_accepted(args.accepted)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rep = build(runs, accepted)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conformance-report.md").write_text(render_md(rep))
    (args.out / "conformance-report.json").write_text(json.dumps(rep, indent=1, default=str))
    for i, p in enumerate(args.junit):
        dest = args.out / (f"conformance-junit-{i}.xml" if i else "conformance-junit.xml")
        if p.resolve() != dest.resolve():
            shutil.copyfile(p, dest)
    for g, c in rep["totals"].items():
        print(f"{g:13s} " + " ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print(f"divergences: {len(rep['divergences'])} (unexplained: {rep['unexplained']})")
    return 1 if rep["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(main())
