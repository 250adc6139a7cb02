"""Where the main job's time goes (``python -m pyrds.testing.timings --matrix DIR --out DIR``).

Reads what ``python -m vm matrix --out DIR`` left: ``DIR/matrix.json`` (boot and guest wall time per kernel)
and ``DIR/<alias>/junit.xml`` (pytest's duration of every test case), and writes ``conformance-timings.md``:
per kernel the guest wall, the boot, the sum of test durations and how much of the wall the workers spent
outside tests (start-up, collection, imports); then, from ``DIR/<alias>/results.json`` (the pyrds plugin's
``--rds-results``: each test's wall-clock start/stop and xdist worker), each worker's timeline: from the
session's start to its first test (interpreter, imports, collection), busy, gaps between its tests, and idle
at the end waiting for the other worker; then the scenarios (test functions) by total time and the slowest
single test cases. The RDS/IB phase (a serial pytest session after the main suite, ``--rds-ib``:
``DIR/<alias>/junit-ib.xml`` and ``results-ib.json``) has a column of its own, its session's wall time, which
the "outside tests" figure leaves out; its test cases are ranked with the others.

Unlike the conformance report this file holds times: it differs from run to run and is never compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

#: how many of the slowest test cases to list per kernel
TOP_CASES = 15


@dataclass(frozen=True)
class Case:
    """One JUnit test case: ``module::function[params]`` and its duration in seconds."""

    name: str
    seconds: float

    @property
    def scenario(self) -> str:
        """The test function without its parameters (``module::function``)."""
        return self.name.split("[", 1)[0]


@dataclass(frozen=True)
class KernelTimes:
    alias: str
    release: str
    boot_s: float | None
    wall_s: float | None
    cases: tuple[Case, ...]
    workers: tuple[WorkerTimes, ...] = ()
    #: the RDS/IB phase's test cases and its session's wall time (None: no such phase in this run)
    ib_cases: tuple[Case, ...] = ()
    ib_wall_s: float | None = None

    @property
    def tests_s(self) -> float:
        return sum(c.seconds for c in self.cases)


def read_cases(junit: Path) -> list[Case]:
    """Test cases of a pytest JUnit file (``classname`` dotted path + name)."""
    cases = []
    for tc in ET.parse(junit).iter("testcase"):
        module = (tc.get("classname") or "").rsplit(".", 1)[-1]
        try:
            seconds = float(tc.get("time") or 0.0)
        except ValueError:
            seconds = 0.0
        cases.append(Case(f"{module}::{tc.get('name', '?')}", seconds))
    return cases


@dataclass(frozen=True)
class WorkerTimes:
    """One pytest-xdist worker's share of a run, in seconds (from results.json start/stop stamps)."""

    worker: str
    tests: int
    to_first_test: float  # session start -> the worker's first test started
    busy: float  # sum of its tests' wall-clock spans (setup + call + teardown)
    gaps: float  # between its first test's start and its last test's stop, not in a test
    idle_at_end: float  # its last test's stop -> the session's end


def read_workers(results: Path) -> list[WorkerTimes]:
    """Per-worker timeline of a ``--rds-results`` file; empty when it has no stamps (older files)."""
    doc = json.loads(results.read_text())
    t0, t1 = _float(doc.get("session_start")), _float(doc.get("session_finish"))
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t in doc.get("tests", []):
        start, stop = _float(t.get("start")), _float(t.get("stop"))
        if start is not None and stop is not None:
            spans[str(t.get("worker", "main"))].append((start, stop))
    if t0 is None or t1 is None:
        return []
    out = []
    for worker, items in sorted(spans.items()):
        items.sort()
        busy = sum(b - a for a, b in items)
        first, last = items[0][0], max(b for _, b in items)
        gaps = max(0.0, last - first - busy)
        out.append(WorkerTimes(worker, len(items), first - t0, busy, gaps, max(0.0, t1 - last)))
    return out


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_matrix(matrix: Path) -> list[KernelTimes]:
    """One :class:`KernelTimes` per kernel named in ``matrix/matrix.json`` (cases empty without JUnit)."""
    doc = json.loads((matrix / "matrix.json").read_text())
    out = []
    for entry in doc.get("kernels", []):
        alias = str(entry.get("alias", "?"))
        junit = matrix / alias / "junit.xml"
        cases = tuple(read_cases(junit)) if junit.is_file() else ()
        results = matrix / alias / "results.json"
        workers = tuple(read_workers(results)) if results.is_file() else ()
        ib_junit = matrix / alias / "junit-ib.xml"
        ib_cases = tuple(read_cases(ib_junit)) if ib_junit.is_file() else ()
        ib_results = matrix / alias / "results-ib.json"
        ib_wall = session_wall(ib_results) if ib_results.is_file() else None
        out.append(
            KernelTimes(
                alias,
                str(entry.get("release", "")),
                _float(entry.get("boot_s")),
                _float(entry.get("wall_s")),
                cases,
                workers,
                ib_cases,
                ib_wall,
            )
        )
    return out


def session_wall(results: Path) -> float | None:
    """A ``--rds-results`` file's session wall time (finish - start), None without both stamps."""
    doc = json.loads(results.read_text())
    t0, t1 = _float(doc.get("session_start")), _float(doc.get("session_finish"))
    return None if t0 is None or t1 is None or t1 < t0 else t1 - t0


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(kernels: list[KernelTimes], workers: int) -> str:
    lines = [
        "# Conformance timings",
        "",
        "Times of one run (they change from run to run). Guest wall = boot to the end of the guest's",
        f"command; tests = sum of pytest's per-test durations of the main suite; with {workers} workers its",
        f"floor is tests / {workers}; IB phase = the wall of the RDS/IB session after it (serial, --rds-ib);",
        "the rest of the wall is boot, worker start-up, imports, collection and idle workers.",
        "",
        "| kernel | release | boot s | guest wall s | tests | sum of tests s | sum / workers s | IB phase s "
        "| wall - boot - sum/workers - IB phase s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in kernels:
        floor = k.tests_s / workers
        rest = None if k.wall_s is None else k.wall_s - (k.boot_s or 0.0) - floor - (k.ib_wall_s or 0.0)
        lines.append(
            f"| {k.alias} | {k.release} | {_s(k.boot_s)} | {_s(k.wall_s)} | {len(k.cases)} | {k.tests_s:.1f} "
            f"| {floor:.1f} | {_s(k.ib_wall_s)} | {_s(rest)} |"
        )
    if any(k.workers for k in kernels):
        lines += [
            "",
            "## Worker timelines",
            "",
            "Wall-clock seconds per pytest-xdist worker: from the session's start to its first test",
            "(interpreter, imports, collection), busy in tests, gaps between its tests, idle at the end",
            "while the other worker still ran.",
            "",
            "| kernel | worker | tests | to first test s | busy s | gaps s | idle at end s |",
            "|---|---|---|---|---|---|---|",
        ]
        for k in kernels:
            for w in k.workers:
                lines.append(
                    f"| {k.alias} | {w.worker} | {w.tests} | {w.to_first_test:.1f} | {w.busy:.1f} "
                    f"| {w.gaps:.1f} | {w.idle_at_end:.1f} |"
                )
    scenarios: dict[str, dict[str, float]] = defaultdict(dict)
    for k in kernels:
        for c in k.cases + k.ib_cases:
            scenarios[c.scenario][k.alias] = scenarios[c.scenario].get(k.alias, 0.0) + c.seconds
    aliases = [k.alias for k in kernels]
    lines += ["", "## Scenarios by total time (all parametrizations)", ""]
    lines += ["| scenario | " + " | ".join(f"{a} s" for a in aliases) + " |", "|---|" + "---|" * len(aliases)]
    ranked = sorted(scenarios.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    for name, per in ranked:
        if sum(per.values()) < 1.0:
            continue
        lines.append(f"| `{name}` | " + " | ".join(f"{per.get(a, 0.0):.1f}" for a in aliases) + " |")
    for k in kernels:
        lines += ["", f"## Slowest test cases on {k.alias}", ""]
        for c in sorted(k.cases + k.ib_cases, key=lambda c: (-c.seconds, c.name))[:TOP_CASES]:
            lines.append(f"- {c.seconds:7.1f} s `{c.name}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyrds.testing.timings", description=__doc__.split("\n")[0])
    ap.add_argument("--matrix", type=Path, required=True, help="the OUT directory of 'python -m vm matrix'")
    ap.add_argument("--out", type=Path, required=True, help="directory for conformance-timings.md")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers of the run (default 2)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    if not (args.matrix / "matrix.json").is_file():
        print(f"timings: {args.matrix / 'matrix.json'} not found", file=sys.stderr)
        return 1
    kernels = read_matrix(args.matrix)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "conformance-timings.md"
    target.write_text(render(kernels, args.workers))
    for k in kernels:
        print(f"timings {k.alias}: wall {_s(k.wall_s)} s, boot {_s(k.boot_s)} s, tests {k.tests_s:.1f} s")
    print(f"timings: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
