"""Conformance report: scenario x backend@kernel, totals, divergences (``python -m pyrds.testing.report``).

Input, one run of the suite per guest kernel:

- ``--kernel-results ALIAS=PATH`` / ``--kernel-junit ALIAS=PATH`` (repeatable): the plugin's ``--rds-results``
  JSON / the pytest JUnit XML of the run on kernel ALIAS (``6.1``, ``6.12``, ``7.3``).
- ``--matrix DIR``: ``DIR/<alias>/results.json`` (the main suite) and ``results-ib.json`` (the RDS/IB phase,
  ``pytest --rds-ib``), each with its JUnit file, for every kernel of ``--kernels`` (``--phases`` names the
  results files); a missing one fails the report.
- ``--results PATH`` / ``--junit PATH`` (repeatable): the same without an alias. A results JSON that records
  ``kernel_release`` gets the alias major.minor of it (``6.1.0-56-amd64`` -> ``6.1``); without it the kernel
  is ``""`` (unknown: plain backend columns, as before kernels were recorded). A plain JUnit file takes the
  kernel of the results files when they name exactly one, else ``""``.

Test cases carry the plugin's properties ``rds_scenario``, ``rds_backend`` and ``rds_obs.*``. A test present
in both a results JSON and a JUnit file of the same kernel is taken from the JSON.

Output (``--out DIR``): ``conformance-report.md``, ``conformance-report.json`` (schema 2, documented in
tests/conformance/README.md) and a copy of each JUnit file (``conformance-junit[-N].xml``). Both reports
are byte-identical for identical inputs (everything sorted, no times).

Within each kernel, a divergence is a scenario whose non-skipped runs on different backends differ in
outcome (passed vs failed) or in a recorded observation, or whose differential machine failed. Accepted
divergences are listed, with a reason each, in ONE file (``tests/conformance/accepted-divergences.toml``:
``[[divergence]] scenario = "glob" kind = "glob" backends = [...] kernels = [...] reason = "..."``; without
``kernels`` an entry applies on every kernel; with it, on a kernel whose alias or release's major.minor it
names, so a kernel of your own under a label is judged as its line). A divergence on an older kernel that
no entry explains is accepted automatically when the userspace stack follows the newest kernel: every
non-kernel value in it equals what the kernel backend showed on the newest kernel, which differs from this
kernel's.

Between kernels, the kernel backend's outcomes and observations are compared scenario by scenario
("Kernel vs kernel"): informational, never a failure.

Exit status: 0 when every divergence is accepted; 1 when one is not, or when a results/JUnit file is
missing or holds no conformance test (the kernel is named); 2 on bad input. Skipped never counts as passed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyrds.testing.kernelinfo import is_kernel_label, short_alias

SCHEMA = 2
#: backends in column order (within one kernel)
BACKENDS = ["kernel", "userspace", "mixed:kernel-userspace", "mixed:userspace-kernel", "differential"]
COLUMNS = BACKENDS  # schema 1 name
COUNTS = ["passed", "failed", "skipped", "xfailed"]
SYMBOL = {"passed": "pass", "failed": "FAIL", "skipped": "skip", "xfailed": "xfail", "error": "ERROR"}
#: the kernel matrix the main job runs (vm/catalog.py MATRIX; this module must not import vm/)
MATRIX_KERNELS = ("6.1", "6.12", "7.3")
#: the pytest sessions each guest of the main job runs, by results file (without ``.json``; the JUnit file of
#: each is ``junit[-suffix].xml``): the main suite, then the RDS/IB phase (``pytest --rds-ib``, tox.ini)
MATRIX_PHASES = ("results", "results-ib")
DEFAULT_ACCEPTED = Path("tests/conformance/accepted-divergences.toml")


@dataclass
class Run:
    scenario: str
    backend: str
    outcome: str
    nodeid: str
    detail: str = ""
    observations: dict[str, str] = field(default_factory=dict)
    kernel: str = ""  # alias ("6.1"), "" when the run did not record its kernel


@dataclass
class Divergence:
    scenario: str
    kind: str  # "outcome", "observation:<key>" or "differential" (the differential machine failed)
    results: dict[str, str]  # backend -> what it showed (on this kernel)
    accepted: bool = False
    reason: str = ""
    kernel: str = ""
    auto: bool = False  # accepted by the "userspace follows the newest kernel" rule, not by the toml file


@dataclass
class KernelDifference:
    """The kernel backend's outcome or an observation differs between kernels (informational)."""

    scenario: str
    kind: str  # "kernels:outcome" or "kernels:observation:<key>"
    results: dict[str, str]  # alias -> what the kernel backend showed


class BadInput(Exception):
    """Unreadable input (bad JSON/XML/toml, ambiguous arguments): exit status 2."""


# ------------------------------------------------------------------------------------------------ kernels


def kernel_key(alias: str) -> tuple[int, tuple[int, ...], str]:
    """Sort key: "" (unknown) first, then versions numerically (6.1 < 6.12 < 7.3), then other names."""
    if not alias:
        return (0, (), "")
    if re.fullmatch(r"\d+(\.\d+)*", alias):
        return (1, tuple(int(x) for x in alias.split(".")), alias)
    return (2, (), alias)


def column(backend: str, kernel: str) -> str:
    return f"{backend}@{kernel}" if kernel else backend


def _backend_key(backend: str) -> tuple[int, str]:
    return (BACKENDS.index(backend), "") if backend in BACKENDS else (len(BACKENDS), backend)


def newest_kernel(kernels: list[str]) -> str:
    """The newest version-like alias among ``kernels`` ("" when there is none)."""
    versions = [k for k in kernels if kernel_key(k)[0] == 1]
    return max(versions, key=kernel_key) if versions else ""


# ------------------------------------------------------------------------------------------------ input


def _junit_runs(path: Path, kernel: str = "") -> list[Run]:
    runs: list[Run] = []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise BadInput(f"{path}: not JUnit XML: {exc}") from exc
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
        runs.append(Run(props["rds_scenario"], props["rds_backend"], outcome, nodeid, detail, obs, kernel))
    return runs


def _summary(longrepr: str) -> str:
    """The ``E   ...`` lines of a pytest failure (what was asserted and seen), else its last line."""
    lines = [ln[1:].strip() for ln in longrepr.splitlines() if ln.startswith("E ")]
    if not lines:
        lines = [ln for ln in longrepr.splitlines() if ln.strip()][-1:]
    return " / ".join(lines[:4])


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not a results JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("tests", []), list):
        raise BadInput(f"{path}: not a results JSON (want {{'tests': [...]}})")
    return data


def _json_runs(path: Path, kernel: str = "") -> list[Run]:
    return _runs_of(_load_json(path), kernel)


def _runs_of(data: dict[str, Any], kernel: str) -> list[Run]:
    runs: list[Run] = []
    for t in data.get("tests", []):
        props = t.get("props", {})
        if "rds_scenario" not in props:
            continue
        obs = {k[len("rds_obs.") :]: v for k, v in props.items() if k.startswith("rds_obs.")}
        detail = t.get("reason") or _summary(t.get("longrepr", ""))
        runs.append(
            Run(
                props["rds_scenario"],
                props["rds_backend"],
                t["outcome"],
                t["nodeid"],
                str(detail)[:500],
                obs,
                kernel,
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
        kernels = e.get("kernels")
        if kernels is not None and (
            not isinstance(kernels, list) or not all(isinstance(k, str) and k for k in kernels)
        ):
            raise ValueError(f"{path}: 'kernels' must be a list of kernel aliases such as \"6.1\": {e}")
    return entries


# ------------------------------------------------------------------------------------------------ analysis


def _outcome_text(r: Run) -> str:
    return f"{r.outcome}: {r.detail}".strip(": ")


def _value(r: Run, kind: str) -> str | None:
    """What ``r`` showed for a divergence kind ("outcome" / "observation:<key>"), None if nothing."""
    if kind == "outcome":
        return r.outcome
    if kind.startswith("observation:"):
        return r.observations.get(kind[len("observation:") :])
    return None


def _within_kernel(kernel: str, by_scenario: dict[str, dict[str, Run]]) -> list[Divergence]:
    out: list[Divergence] = []
    for scenario, cols in sorted(by_scenario.items()):
        diff = cols.get("differential")
        if diff is not None and diff.outcome == "failed":
            # the differential machine runs both backends itself: its failure IS a divergence
            out.append(Divergence(scenario, "differential", {"differential": diff.detail}, kernel=kernel))
        ran = {b: r for b, r in sorted(cols.items()) if r.outcome not in ("skipped",)}
        if len(ran) >= 2 and len({r.outcome for r in ran.values()}) > 1:
            results = {b: _outcome_text(r) for b, r in ran.items()}
            out.append(Divergence(scenario, "outcome", results, kernel=kernel))
        keys = sorted({k for r in ran.values() for k in r.observations})
        for key in keys:
            seen = {b: r.observations[key] for b, r in ran.items() if key in r.observations}
            if len(seen) >= 2 and len(set(seen.values())) > 1:
                out.append(Divergence(scenario, f"observation:{key}", seen, kernel=kernel))
    return out


def _accept(d: Divergence, accepted: list[dict[str, Any]], lines: dict[str, set[str]] | None = None) -> None:
    """The first entry of ``accepted`` that explains ``d``. An entry's ``kernels`` name major.minor lines:
    they match the kernel's alias, or the line of its release (``lines``: a kernel of your own under a label,
    ``patched`` running 7.3.4-dirty, is a 7.3 to an entry for ``"7.3"``)."""
    own = {d.kernel} | (lines or {}).get(d.kernel, set())
    for e in accepted:
        if not fnmatch.fnmatchcase(d.scenario, e["scenario"]):
            continue
        if "kind" in e and not fnmatch.fnmatchcase(d.kind, e["kind"]):
            continue
        wanted = set(e.get("backends", []))
        if wanted and not wanted & set(d.results):
            continue
        if "kernels" in e and not own & set(e["kernels"]):
            continue
        d.accepted, d.reason = True, str(e["reason"])
        return


def _auto_accept(d: Divergence, runs: dict[str, dict[str, dict[str, Run]]], newest: str) -> None:
    """Accept ``d`` when the userspace stack shows what the newest kernel shows and this kernel differs."""
    if not newest or not d.kernel or d.kernel == newest or d.kind == "differential":
        return
    mine = runs[d.kernel][d.scenario]
    ref = runs.get(newest, {}).get(d.scenario, {}).get("kernel")
    if ref is None or ref.outcome == "skipped" or "kernel" not in mine:
        return
    want, have = _value(ref, d.kind), _value(mine["kernel"], d.kind)
    others = [b for b in d.results if b != "kernel"]
    if want is None or have is None or want == have or not others or "kernel" not in d.results:
        return
    if all(_value(mine[b], d.kind) == want for b in others):
        d.accepted, d.auto = True, True
        d.reason = (
            f"userspace follows kernel {newest}; kernel {d.kernel} differs "
            f"(kernel@{d.kernel}: {have}, kernel@{newest}: {want})"
        )


def _grouped(runs: list[Run]) -> dict[str, dict[str, dict[str, Run]]]:
    """kernel -> scenario -> backend -> run (the last one wins, as in the JUnit/JSON merge)."""
    out: dict[str, dict[str, dict[str, Run]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        out[r.kernel][r.scenario][r.backend] = r
    return out


def find_divergences(
    runs: list[Run], accepted: list[dict[str, Any]], releases: dict[str, str] | None = None
) -> list[Divergence]:
    """Divergences between backends within each kernel, with acceptance applied (``releases``: alias ->
    the release(s) its results recorded, comma-separated, for :func:`_accept`)."""
    lines = {
        alias: {short_alias(r.strip()) for r in text.split(",") if r.strip()}
        for alias, text in (releases or {}).items()
    }
    grouped = _grouped(runs)
    newest = newest_kernel(list(grouped))
    out: list[Divergence] = []
    for kernel in sorted(grouped, key=kernel_key):
        out += _within_kernel(kernel, grouped[kernel])
    out.sort(key=lambda d: (kernel_key(d.kernel), d.scenario, d.kind))
    for d in out:
        _accept(d, accepted, lines)
        if not d.accepted:
            _auto_accept(d, grouped, newest)
    return out


def find_kernel_differences(runs: list[Run]) -> list[KernelDifference]:
    """The kernel backend, scenario by scenario, across kernels (skips compared by outcome only)."""
    per: dict[str, dict[str, Run]] = defaultdict(dict)  # scenario -> alias -> run
    for r in runs:
        if r.backend == "kernel" and r.kernel:
            per[r.scenario][r.kernel] = r
    out: list[KernelDifference] = []
    for scenario, by_kernel in sorted(per.items()):
        if len(by_kernel) < 2:
            continue
        order = sorted(by_kernel, key=kernel_key)
        if len({by_kernel[k].outcome for k in order}) > 1:
            out.append(
                KernelDifference(scenario, "kernels:outcome", {k: _outcome_text(by_kernel[k]) for k in order})
            )
        ran = [k for k in order if by_kernel[k].outcome != "skipped"]
        for key in sorted({o for k in ran for o in by_kernel[k].observations}):
            seen = {k: by_kernel[k].observations[key] for k in ran if key in by_kernel[k].observations}
            if len(seen) >= 2 and len(set(seen.values())) > 1:
                out.append(KernelDifference(scenario, f"kernels:observation:{key}", seen))
    return sorted(out, key=lambda d: (d.scenario, d.kind))


def build(
    runs: list[Run],
    accepted: list[dict[str, Any]],
    kernels: dict[str, str] | None = None,
    missing: list[dict[str, str]] | None = None,
    guest_deaths: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report (schema 2). ``kernels``: alias -> release of every kernel asked for, with or without runs;
    ``missing``: input files that were absent or held no conformance test; ``guest_deaths``: guests that
    died while the suite ran and were booted again (``vm matrix``'s guest-deaths.json, kernel added)."""
    runs = sorted(runs, key=lambda r: (kernel_key(r.kernel), r.scenario, _backend_key(r.backend), r.nodeid))
    releases = {k: v for k, v in (kernels or {}).items() if k}
    for r in runs:
        if r.kernel:
            releases.setdefault(r.kernel, "")
    aliases = sorted(set(releases) | {r.kernel for r in runs}, key=kernel_key)
    present = {(r.kernel, r.backend) for r in runs}
    columns: list[str] = []
    for k in aliases:
        extra = sorted({b for kk, b in present if kk == k and b not in BACKENDS})
        columns += [column(b, k) for b in BACKENDS + extra]
    scenarios: dict[str, dict[str, str]] = defaultdict(dict)
    totals: dict[str, Counter[str]] = {c: Counter({o: 0 for o in COUNTS}) for c in columns}
    for r in runs:
        col = column(r.backend, r.kernel)
        scenarios[r.scenario][col] = r.outcome
        totals[col][r.outcome] += 1
    divs = find_divergences(runs, accepted, releases)
    return {
        "schema": SCHEMA,
        "kernels": {k: releases[k] for k in sorted(releases, key=kernel_key)},
        "columns": columns,
        "scenarios": {k: scenarios[k] for k in sorted(scenarios)},
        "totals": {c: {**dict(t), "total": sum(t.values())} for c, t in totals.items()},
        "divergences": [asdict(d) for d in divs],
        "kernel_differences": [asdict(d) for d in find_kernel_differences(runs)],
        "unexplained": sum(1 for d in divs if not d.accepted),
        "missing": sorted(missing or [], key=lambda m: (kernel_key(m["kernel"]), m["path"], m["problem"])),
        "guest_deaths": sorted(guest_deaths or [], key=lambda d: (kernel_key(d["kernel"]), d["attempt"])),
        "runs": [asdict(r) for r in runs],
    }


# ------------------------------------------------------------------------------------------------ output


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def _kernel_label(alias: str, release: str) -> str:
    if not alias:
        return "kernel not recorded"
    return f"kernel {alias} ({release})" if release else f"kernel {alias}"


def _backends_of(rep: dict[str, Any]) -> list[str]:
    seen = {c.rsplit("@", 1)[0] if "@" in c else c for c in rep["columns"]}
    return sorted(seen, key=_backend_key)


def _kernels_of(rep: dict[str, Any]) -> list[str]:
    out = {c.rsplit("@", 1)[1] if "@" in c else "" for c in rep["columns"]}
    return sorted(out, key=kernel_key)


def _total_cell(t: dict[str, int] | None) -> str:
    if not t or not t.get("total"):
        return "-"
    parts = [f"{t[o]} {SYMBOL[o]}" for o in COUNTS if t.get(o)]
    parts += [f"{n} {o}" for o, n in sorted(t.items()) if o not in COUNTS and o != "total" and n]
    return ", ".join(parts) + f" = {t['total']}"


def render_md(rep: dict[str, Any]) -> str:
    kernels = _kernels_of(rep)
    backends = _backends_of(rep)
    releases: dict[str, str] = rep.get("kernels", {})
    lines = ["# pyrds conformance report", ""]
    lines.append(
        "Outcome per scenario, backend and guest kernel (kernel = native AF_RDS, userspace = pyrds stack, "
        "mixed = node A / node B backends over RDS/TCP between two namespaces, or over RDS/IB between two "
        "addresses of one rxe device in test_ib.py; column `backend@6.1` = that "
        "backend on kernel 6.1). Backends are compared within each kernel; kernels only informationally. "
        "Skipped is never counted as passed."
    )
    if rep["missing"]:
        lines += ["", f"## MISSING RESULTS ({len(rep['missing'])})", ""]
        lines += ["| kernel | file | problem |", "|---|---|---|"]
        for m in rep["missing"]:
            lines.append(f"| {m['kernel'] or '?'} | `{_cell(m['path'])}` | **{m['problem']}** |")
    deaths = rep.get("guest_deaths", [])
    if deaths:
        lines += ["", f"## Guest deaths ({len(deaths)})", ""]
        lines.append(
            "A guest that ended while the suite ran, with no exit status (kernel panic, QEMU death); "
            "`vm matrix` booted that kernel again and the results below are the last boot's. "
            "`kernel crash` = the guest kernel's console shows an oops, BUG or panic: a kernel bug the "
            "suite ran into, recorded here."
        )
        for d in deaths:
            crash = "**kernel crash**" if d.get("kernel_crash") else "no kernel crash on the console"
            when = f"attempt {d['attempt']} after {d.get('wall_s', '?')} s"
            lines += ["", f"### {d['kernel']}, {when}: {crash}", ""]
            tail = [str(x) for x in d.get("console_tail", [])][-25:]
            lines += ["```", *(tail or ["(the console printed nothing)"]), "```"]
    lines += ["", "## Kernels", "", "| kernel | release | " + " | ".join(backends) + " |"]
    lines.append("|---|---|" + "---|" * len(backends))
    for k in kernels:
        counts = [rep["totals"].get(column(b, k)) for b in backends]
        release = releases.get(k, "") or "-"
        if not any(t and t.get("total") for t in counts):
            release += " **NO RESULTS**"
        lines.append(f"| {k or '-'} | {release} | " + " | ".join(_total_cell(t) for t in counts) + " |")
    divs = rep["divergences"]
    lines += ["", f"## Divergences ({len(divs)}, unexplained: {rep['unexplained']})", ""]
    if not divs:
        lines.append("None.")
    for k in kernels:
        mine = [d for d in divs if d["kernel"] == k]
        if not mine:
            continue
        bad = sum(1 for d in mine if not d["accepted"])
        lines += [f"### On {_kernel_label(k, releases.get(k, ''))}: {len(mine)}, unexplained: {bad}", ""]
        for d in mine:
            if d["accepted"]:
                status = ("ACCEPTED (auto): " if d["auto"] else "ACCEPTED: ") + d["reason"]
            else:
                status = "**UNEXPLAINED**"
            lines += [f"#### `{d['scenario']}` ({d['kind']})", "", status, "", "| backend | observed |"]
            lines.append("|---|---|")
            for b, v in sorted(d["results"].items(), key=lambda kv: _backend_key(kv[0])):
                lines.append(f"| {b} | {_cell(v)} |")
            lines.append("")
    kdiffs = rep["kernel_differences"]
    aliases = [k for k in kernels if k]
    lines += ["", f"## Kernel vs kernel ({len(kdiffs)}, informational)", ""]
    lines += ["The kernel backend on each kernel where its outcome or an observation differs.", ""]
    if not kdiffs:
        lines.append("None." if len(aliases) >= 2 else "Fewer than two kernels: nothing compared.")
    else:
        lines += ["| scenario | kind | " + " | ".join(aliases) + " |", "|---|---|" + "---|" * len(aliases)]
        for d in kdiffs:
            cells = [_cell(d["results"].get(k, "")) for k in aliases]
            lines.append(f"| `{_cell(d['scenario'])}` | {d['kind']} | " + " | ".join(cells) + " |")
    cols = rep["columns"]
    lines += ["", "## Scenario x backend", "", "| scenario | " + " | ".join(cols) + " |"]
    lines.append("|---|" + "---|" * len(cols))
    for name, outcomes in rep["scenarios"].items():
        cells = [SYMBOL.get(outcomes[c], outcomes[c]) if c in outcomes else "" for c in cols]
        lines.append(f"| `{_cell(name)}` | " + " | ".join(cells) + " |")
    skips = Counter((r["kernel"], r["detail"]) for r in rep["runs"] if r["outcome"] == "skipped")
    if skips:
        lines += ["", "## Skip reasons", "", "| count | kernel | reason |", "|---|---|---|"]
        for (k, reason), n in sorted(skips.items(), key=lambda kv: (-kv[1], kernel_key(kv[0][0]), kv[0][1])):
            lines.append(f"| {n} | {k or '-'} | {_cell(reason)} |")
    return "\n".join(lines) + "\n"


def render_json(rep: dict[str, Any]) -> str:
    return json.dumps(rep, indent=1, sort_keys=True, default=str) + "\n"


# ------------------------------------------------------------------------------------------------ CLI


def _alias_path(text: str) -> tuple[str, Path]:
    alias, sep, path = text.partition("=")
    alias = alias.strip()
    if not sep or not alias or not path or "@" in alias or any(c.isspace() for c in alias):
        raise argparse.ArgumentTypeError(f"want ALIAS=PATH (e.g. 6.1=build/results.json), got {text!r}")
    return alias, Path(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyrds.testing.report", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--junit", action="append", default=[], type=Path, help="pytest --junitxml file (repeatable)"
    )
    ap.add_argument(
        "--results",
        action="append",
        default=[],
        type=Path,
        help="pytest --rds-results JSON (repeatable); its kernel_release gives the kernel alias",
    )
    ap.add_argument(
        "--kernel-results",
        action="append",
        default=[],
        type=_alias_path,
        metavar="ALIAS=PATH",
        help="--rds-results JSON of the run on kernel ALIAS, e.g. 6.1=... (repeatable)",
    )
    ap.add_argument(
        "--kernel-junit",
        action="append",
        default=[],
        type=_alias_path,
        metavar="ALIAS=PATH",
        help="pytest --junitxml file of the run on kernel ALIAS (repeatable)",
    )
    ap.add_argument(
        "--matrix",
        type=Path,
        metavar="DIR",
        help="results of 'python -m vm matrix --out DIR': per kernel DIR/<alias>/<phase>.json and its JUnit "
        "file for every phase of --phases",
    )
    ap.add_argument(
        "--kernels",
        help="with --matrix: the kernels that must have results (default: those DIR/matrix.json planned, "
        f"else {','.join(MATRIX_KERNELS)})",
    )
    ap.add_argument(
        "--phases",
        default=",".join(MATRIX_PHASES),
        help="with --matrix: the results files every kernel must have, without .json, each with its JUnit "
        f"file junit[-suffix].xml (default {','.join(MATRIX_PHASES)}: the main suite and the RDS/IB phase)",
    )
    ap.add_argument("--accepted", type=Path, default=DEFAULT_ACCEPTED)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    if args.matrix is not None:
        phases = [p.strip() for p in args.phases.split(",") if p.strip()]
        if not phases or not all(re.fullmatch(r"results(-[\w.]+)?", p) for p in phases):
            ap.error(f"--phases: names such as results,results-ib, not {args.phases!r}")
        try:
            wanted = args.kernels.split(",") if args.kernels is not None else planned_kernels(args.matrix)
        except BadInput as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        args.kernels = ",".join(wanted)  # what _guest_deaths reads too
        for alias in (k.strip() for k in wanted if k.strip()):
            for phase in phases:
                args.kernel_results.append((alias, args.matrix / alias / f"{phase}.json"))
                junit = args.matrix / alias / f"{phase.replace('results', 'junit', 1)}.xml"
                if junit.is_file():  # the results JSON is what must be there
                    args.kernel_junit.append((alias, junit))
    if not (args.junit or args.results or args.kernel_results or args.kernel_junit):
        ap.error("give --matrix DIR, or --junit, --results, --kernel-results or --kernel-junit files")
    try:
        accepted = load_accepted(args.accepted)
        runs, kernels, missing = _collect(args)
        deaths = _guest_deaths(args)
    except (BadInput, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rep = build(runs, accepted, kernels, missing, deaths)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conformance-report.md").write_text(render_md(rep))
    (args.out / "conformance-report.json").write_text(render_json(rep))
    junits = [p for p in args.junit if p.is_file()] + [p for _, p in args.kernel_junit if p.is_file()]
    for i, p in enumerate(junits):
        dest = args.out / (f"conformance-junit-{i}.xml" if i else "conformance-junit.xml")
        if p.resolve() != dest.resolve():
            shutil.copyfile(p, dest)
    for c, t in rep["totals"].items():
        print(f"{c:28s} " + " ".join(f"{k}={v}" for k, v in t.items()))
    print(f"divergences: {len(rep['divergences'])} (unexplained: {rep['unexplained']})")
    print(f"kernel vs kernel differences: {len(rep['kernel_differences'])} (informational)")
    for d in rep["guest_deaths"]:
        what = "a kernel crash on its console" if d["kernel_crash"] else "no kernel crash on its console"
        print(f"guest death: kernel {d['kernel']}, attempt {d['attempt']}: {what} (booted again)")
    for m in rep["missing"]:
        who = f"kernel {m['kernel']}" if m["kernel"] else "kernel unknown"
        print(f"error: {who}: {m['path']}: {m['problem']}", file=sys.stderr)
    return 1 if rep["unexplained"] or rep["missing"] else 0


def planned_kernels(matrix: Path) -> list[str]:
    """The kernels ``python -m vm matrix --out DIR`` set out to boot (``DIR/matrix.json``, written before
    the first boot, so a kernel that never ran is still asked for); without that file the matrix's three."""
    path = matrix / "matrix.json"
    if not path.is_file():
        return list(MATRIX_KERNELS)
    planned = _load_json(path).get("planned", list(MATRIX_KERNELS))
    if not (
        isinstance(planned, list)
        and planned
        and all(isinstance(k, str) and is_kernel_label(k) for k in planned)
    ):
        raise BadInput(f"{path}: 'planned' must be a list of kernel aliases, not {planned!r}")
    return planned


def _guest_deaths(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``DIR/<alias>/guest-deaths.json`` of every kernel of ``--matrix DIR`` (absent: none died)."""
    if args.matrix is None:
        return []
    deaths: list[dict[str, Any]] = []
    for alias in (k.strip() for k in args.kernels.split(",") if k.strip()):
        path = args.matrix / alias / "guest-deaths.json"
        if not path.is_file():
            continue
        found = _load_json(path).get("deaths")
        if not isinstance(found, list) or not all(isinstance(d, dict) for d in found):
            raise BadInput(f"{path}: no list of deaths")
        for d in found:
            attempt = d.get("attempt")
            if not isinstance(attempt, int):
                raise BadInput(f"{path}: a death without an attempt number")
            tail = d.get("console_tail", [])
            deaths.append(
                {
                    "kernel": alias,
                    "attempt": attempt,
                    "wall_s": d.get("wall_s"),
                    "kernel_crash": bool(d.get("kernel_crash")),
                    "console_tail": [str(x) for x in tail] if isinstance(tail, list) else [],
                }
            )
    return deaths


def _collect(args: argparse.Namespace) -> tuple[list[Run], dict[str, str], list[dict[str, str]]]:
    """Runs of every input file, alias -> release, and the files that were missing or empty."""
    runs: list[Run] = []
    releases: dict[str, set[str]] = defaultdict(set)
    missing: list[dict[str, str]] = []
    result_kernels: set[str] = set()
    for alias, path in [(None, p) for p in args.results] + list(args.kernel_results):
        if not path.is_file():
            missing.append({"kernel": alias or "", "path": str(path), "problem": "results file is missing"})
            if alias:
                releases.setdefault(alias, set())
            continue
        data = _load_json(path)
        release = str(data.get("kernel_release") or "")
        kernel = alias if alias is not None else short_alias(release)
        if alias is not None and release and short_alias(release) != alias:
            print(f"warning: {path}: kernel_release {release} given as kernel {alias}", file=sys.stderr)
        found = _runs_of(data, kernel)
        if not found:
            missing.append({"kernel": kernel, "path": str(path), "problem": "no conformance test in it"})
        if kernel:
            releases[kernel].update([release] if release else [])
        result_kernels.add(kernel)
        runs += found
    if args.junit and len(result_kernels) > 1:
        raise BadInput(
            "a plain --junit with results of several kernels ("
            + ", ".join(sorted(k or '""' for k in result_kernels))
            + "): give it as --kernel-junit ALIAS=PATH"
        )
    plain = next(iter(result_kernels)) if result_kernels else ""
    seen = {(r.kernel, r.nodeid.split("::")[-1], r.scenario, r.backend) for r in runs}
    for alias, path in [(plain, p) for p in args.junit] + list(args.kernel_junit):
        if not path.is_file():
            missing.append({"kernel": alias, "path": str(path), "problem": "JUnit file is missing"})
            if alias:
                releases.setdefault(alias, set())
            continue
        found = _junit_runs(path, alias)
        if not found:
            missing.append({"kernel": alias, "path": str(path), "problem": "no conformance test in it"})
        if alias:
            releases.setdefault(alias, set())
        for r in found:
            if (r.kernel, r.nodeid.split("::")[-1], r.scenario, r.backend) not in seen:
                runs.append(r)
    return runs, {k: ", ".join(sorted(v)) for k, v in releases.items()}, missing


if __name__ == "__main__":
    sys.exit(main())
