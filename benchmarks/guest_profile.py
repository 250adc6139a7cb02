"""Where a request/response cell's CPU goes, process by process, sampled across the whole machine (issue 10,
docs/userspace-profile.md).

One cell of ``floor.py`` (request/response between two namespaces joined by a veth pair, blocking loops) runs
for ``-T`` seconds per kind; after ``--warmup`` seconds ``perf record -a`` samples every CPU for
``--sample`` seconds. The report gives, as shares of all samples: idle (the swapper), each process with its
role (service, client, other: from its command line while the cell ran) split into user and kernel time, and
the top symbols of each service and client. The issue asks the closing note for "the profile of what still
separates userspace from the kernel": this takes it in one command.

Guest only (root, AF_RDS, rds_tcp, ``perf``):
``python benchmarks/guest_profile.py [--kinds userspace,kernel] [-T 24] [--warmup 12] [--sample 6]``;
the last line is ``PYRDS-PROFILE-JSON``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Container
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: a ``perf report --sort pid[,dso]`` row: share, pid, command, then the dso if sorted by it
_ROW = re.compile(r"^\s*([0-9.]+)%\s+(\d+):(\S+)(?:\s+(\S.*?))?\s*$")
#: a ``perf report --sort pid,sym`` row: share, pid, command, [k] or [.], symbol. Not ``--pid P --sort sym``:
#: perf keys those rows by symbol alone, so one process's row holds every process's samples of that symbol
_SYM = re.compile(r"^\s*([0-9.]+)%\s+(\d+):(\S+)\s+\[([k.])\]\s+(.+?)\s*$")

KINDS = ("userspace", "kernel")


def role_of(cmdline: str) -> str:
    """What a process is in the cell, from its command line."""
    if "pyrds.userspace.service" in cmdline:
        return "service"
    if "floor.py" in cmdline and " end " in f" {cmdline} ":
        return "client"
    return "other"


def parse_pid_dso(text: str) -> dict[int, dict[str, Any]]:
    """``perf report --sort pid,dso --stdio`` -> {pid: {"comm", "total", "kernel", "user"}} (percent of
    all samples)."""
    procs: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _ROW.match(line)
        if m is None:
            continue
        share, pid, comm, dso = float(m.group(1)), int(m.group(2)), m.group(3), m.group(4) or ""
        p = procs.setdefault(pid, {"comm": comm, "total": 0.0, "kernel": 0.0, "user": 0.0})
        p["total"] += share
        p["kernel" if dso.startswith("[kernel") else "user"] += share
    for p in procs.values():
        for k in ("total", "kernel", "user"):
            p[k] = round(p[k], 2)
    return procs


def parse_symbols(text: str, limit: int) -> dict[int, list[tuple[float, str, str]]]:
    """``perf report --sort pid,sym --stdio`` -> {pid: its first ``limit`` rows as (percent of all samples,
    "k" or "u", symbol)}."""
    out: dict[int, list[tuple[float, str, str]]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SYM.match(line)
        if m is not None:
            rows = out.setdefault(int(m.group(2)), [])
            if len(rows) < limit:
                rows.append((float(m.group(1)), "k" if m.group(4) == "k" else "u", m.group(5)))
    return out


def _cmdlines(known: Container[int] = ()) -> dict[int, str]:
    """The command lines of the processes running now, but those in ``known`` (not read again)."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in known:
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            out[int(entry)] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return out


def _report(data: Path, *args: str) -> str:
    """``perf report``'s text; RuntimeError when it fails (an empty report is not "no samples")."""
    cmd = ["perf", "report", "-i", str(data), "--stdio", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"perf report failed: {res.stderr[-500:]}")
    return res.stdout


def profile_kind(
    kind: str, seconds: float, warmup: float, sample: float, top: int, freq: int
) -> dict[str, Any]:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import floor
    from topology import teardown

    a, b = floor.floor_pair("gp")
    # this tree for every process of the cell, the stack services it autostarts included
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)
    for node in (a, b):
        node.env["PYTHONPATH"] = path
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["msgs_per_s"] = floor.run_cell(kind, "rr", a, b, 1024, seconds, None)
        except Exception as exc:  # reported in the row, the sampling goes on
            result["error"] = f"{type(exc).__name__}: {exc}"

    with tempfile.TemporaryDirectory(prefix="pyrds-profile-") as tmp:
        data = Path(tmp) / "perf.data"
        cell = threading.Thread(target=run)
        try:
            cell.start()
            time.sleep(warmup)
            record = ["perf", "record", "-a", "-F", str(freq), "-o", str(data), "--", "sleep", str(sample)]
            rec = subprocess.Popen(record, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            # every process seen while perf samples, short-lived ones too (a service's launcher, which forks
            # the daemon and exits): /proc looked at every 0.2 s until perf is done, only new pids read (this
            # process's own share stays small, under 2 % of the samples in a 7.3 TCG guest)
            roles: dict[int, str] = {}
            deadline = time.monotonic() + sample + 300
            while True:
                roles.update({pid: role_of(cmd) for pid, cmd in _cmdlines(roles).items()})
                if rec.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if rec.poll() is None:
                rec.kill()
            _, rec_err = rec.communicate()
            cell.join(seconds + 300)
        finally:
            teardown([a, b])
        if rec.returncode != 0 or not data.exists():
            return {"kind": kind, "error": f"perf record failed: {rec_err[-500:]}", **result}
        try:
            procs = parse_pid_dso(_report(data, "--sort", "pid,dso"))
            symbols = parse_symbols(_report(data, "--sort", "pid,sym"), top)
        except RuntimeError as exc:
            return {"kind": kind, **result, "error": str(exc)}
        rows: list[dict[str, Any]] = []
        for pid, p in sorted(procs.items(), key=lambda kv: -kv[1]["total"]):
            role = "idle" if pid == 0 else roles.get(pid, "other")
            row = {"pid": pid, "role": role, **p}
            if role in ("service", "client"):
                row["top"] = [{"share": s, "where": w, "symbol": n} for s, w, n in symbols.get(pid, [])]
            rows.append(row)
    idle = sum(r["total"] for r in rows if r["role"] == "idle")
    by_role = {
        role: round(sum(r["total"] for r in rows if r["role"] == role), 2)
        for role in ("service", "client", "other")
    }
    return {"kind": kind, **result, "idle": round(idle, 2), "by_role": by_role, "procs": rows[:16]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS), help="floor.py kinds, comma-separated")
    ap.add_argument("-T", "--duration", type=float, default=24.0, help="seconds each cell runs")
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds before sampling starts")
    ap.add_argument("--sample", type=float, default=6.0, help="seconds sampled")
    ap.add_argument("--top", type=int, default=12, help="symbols listed per service and client")
    ap.add_argument("--freq", type=int, default=400, help="samples per second per CPU")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        ap.error(f"--kinds takes {', '.join(KINDS)}")
    if not (0 < args.warmup and 0 < args.sample and args.warmup + args.sample < args.duration):
        ap.error("need 0 < --warmup, 0 < --sample and --warmup + --sample < -T")
    if not (1 <= args.top <= 200 and 1 <= args.freq <= 10000):
        ap.error("--top takes 1-200, --freq 1-10000")
    if shutil.which("perf") is None:
        print("guest_profile: no perf on PATH", file=sys.stderr)
        return 1
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        row = profile_kind(kind, args.duration, args.warmup, args.sample, args.top, args.freq)
        rows.append(row)
        if "error" in row:
            print(f"{kind}: {row['error']}", flush=True)
            continue
        print(
            f"{kind}: {row.get('msgs_per_s', 0):.1f} msgs/s, idle {row['idle']} %, by role {row['by_role']}",
            flush=True,
        )
        for p in row["procs"]:
            print(
                f"  {p['pid']:>7} {p['role']:<8} {p['comm']:<14} {p['total']:6.2f} % "
                f"(user {p['user']:.2f}, kernel {p['kernel']:.2f})",
                flush=True,
            )
            for s in p.get("top", [])[:5]:
                print(f"           {s['share']:6.2f} % [{s['where']}] {s['symbol']}", flush=True)
    print("PYRDS-PROFILE-JSON " + json.dumps(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
