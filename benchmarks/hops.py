"""Where a userspace round trip's time goes: CPU and context switches per message of every process of both
nodes, and the whole machine's busy and idle time per message (issue 10; docs/userspace-profile.md).

Guest (root, AF_RDS): ``python benchmarks/hops.py [--size N ...] [-T 6] [--repeat N] [--one-way]
[--only LABEL] [--tree NAME=PATH ...]``; also runs on a host without AF_RDS with ``--only userspace``
(``--prefix`` names the namespaces). Each row is one ``pyrds stress`` cell (request/response at depth 1, or
one-way) between two network namespaces joined by a veth pair: kernel<->kernel, then userspace<->userspace
with this tree and with every ``--tree`` (another checkout of pyrds, e.g. the commit before a change: each
tree gets its own namespaces and stack services, and the cells alternate). Per-second rows of the active
side pace the samples: ``/proc/<pid>/stat`` (user+system CPU) and every thread's context switches of every
process in the two namespaces, and ``/proc/stat``, are read after the run's first row and again a second
before its end; messages in between are the rows' rates times their spans. A round trip whose machine busy
time per message is about the round trip time (one CPU busy throughout: the path is sequential) is bound by
work; one far below it waits (a timer, a delayed ACK, a slow wakeup). The last line is ``PYRDS-HOPS-JSON``
and every row as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
# the clone's pyrds when no pyrds is installed or on PYTHONPATH (appended: those come first); the measured
# processes get their tree through PYTHONPATH and their working directory (:func:`cell`)
sys.path.append(str(HERE.parent))

from topology import USERSPACE_PORT, Node, teardown, userspace_node  # noqa: E402

PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")


def _proc(pid: int) -> tuple[float, float, int, int, str] | None:
    """(CPU seconds, of them in the kernel, voluntary, involuntary context switches, short name) of ``pid``;
    None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        sw = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
        for task in Path(f"/proc/{pid}/task").iterdir():  # every thread (stress runs its task in one)
            for ln in (task / "status").read_text().splitlines():
                k, _, v = ln.partition(":\t")
                if k in sw:
                    sw[k] += int(v)
    except OSError:
        return None
    words = [w.decode(errors="replace") for w in cmd if w]
    name = (
        "service"
        if any("userspace.service" in w for w in words)
        else ("passive" if "--passive" in words else "active")
    )
    cpu = (int(stat[11]) + int(stat[12])) / TICK
    system = int(stat[12]) / TICK
    return cpu, system, sw.get("voluntary_ctxt_switches", 0), sw.get("nonvoluntary_ctxt_switches", 0), name


def _machine() -> tuple[float, float, float]:
    """(busy, idle, of busy the kernel's: system, irq, softirq) seconds of all CPUs (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / TICK, idle / TICK, (f[2] + f[5] + f[6]) / TICK


def _sample(nodes: tuple[Node, Node]) -> dict[str, Any]:
    from pyrds.netns import netns_pids

    procs: dict[str, tuple[float, float, int, int, str]] = {}
    for n in nodes:
        for pid in netns_pids(n.ns):
            got = _proc(pid)
            if got is not None:
                procs[f"{n.ns}:{pid}"] = got
    return {"t": time.monotonic(), "procs": procs, "machine": _machine()}


def cell(
    label: str,
    a: Node,
    b: Node,
    backend: str,
    size: int,
    dur: float,
    port: int,
    tree: Path = ROOT,
    one_way: bool = False,
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    base = [PY, "-m", "pyrds.cli.main", "stress", "--json", "--backend", backend, "-p", str(port)]
    with tempfile.TemporaryFile("w+") as pout:
        passive = b.popen(
            [*base, "--passive", "-s", b.addr],
            stdout=pout,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tree,
        )
        assert passive.stderr is not None
        while "passive on" not in passive.stderr.readline():
            if passive.poll() is not None:
                return {"scenario": label, "error": "passive side did not start"}
        # the per-second rows (stderr with --json) pace the samples: the first after the run's first
        # second (start-up, imports and the hello exchange are slow under TCG), the last a second before
        # the end; the round trips between them are the rows' rates times their spans
        run = ["-s", a.addr, "-r", b.addr, "-q", str(size), "-T", str(dur), "-W", "60"]
        run += ["--one-way"] if one_way else []
        active = a.popen(
            [*base, *run], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tree
        )
        assert active.stderr is not None
        s0: dict[str, Any] | None = None
        s1: dict[str, Any] | None = None
        msgs = 0.0
        last = 0.0
        for line in active.stderr:
            words = line.split()
            try:
                sec, tx = float(words[0]), float(words[1])
            except (ValueError, IndexError):
                continue
            if s0 is None:
                s0, last = _sample((a, b)), sec
                continue
            if s1 is None:
                msgs += tx * (sec - last)
                last = sec
                if sec >= dur - 1.2:
                    s1 = _sample((a, b))
        out = active.communicate(timeout=dur + 120)[0]
        passive.terminate()
        passive.wait(15)
    if s0 is None or s1 is None or msgs <= 0:
        return {"scenario": label, "error": "run too short to sample"}
    try:
        doc = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"scenario": label, "error": "no result"}
    rows = []
    for key, (cpu1, sys1, v1, n1, name) in sorted(s1["procs"].items()):
        if key not in s0["procs"]:
            continue
        cpu0, sys0, v0, n0, _ = s0["procs"][key]
        rows.append(
            {
                "proc": f"{key.split(':')[0]}/{name}",
                "cpu_us_per_msg": round((cpu1 - cpu0) / msgs * 1e6, 1),
                "sys_us_per_msg": round((sys1 - sys0) / msgs * 1e6, 1),
                "vol_cs_per_msg": round((v1 - v0) / msgs, 2),
                "invol_cs_per_msg": round((n1 - n0) / msgs, 2),
            }
        )
    busy = s1["machine"][0] - s0["machine"][0]
    idle = s1["machine"][1] - s0["machine"][1]
    return {
        "scenario": label,
        "size": size,
        "mode": "oneway" if one_way else "rr",
        "msgs_per_s": doc["msgs_per_s"],
        "p50_us": doc["rtt_us"]["p50"] if doc.get("rtt_us") else None,
        "machine_busy_us_per_msg": round(busy / msgs * 1e6, 1),
        "machine_idle_us_per_msg": round(idle / msgs * 1e6, 1),
        "machine_kernel_us_per_msg": round((s1["machine"][2] - s0["machine"][2]) / msgs * 1e6, 1),
        "procs": rows,
    }


def _pair(prefix: str, tag: str, subnet: str) -> tuple[Node, Node]:
    """Namespaces ``<prefix><tag>1``/``2`` with ``<subnet>.1``/``.2``/24 on a veth pair (as
    topology.make_pair, with a chosen prefix so that a host run keeps to its own names)."""
    from pyrds import netns

    n1, n2 = f"{prefix}{tag}1", f"{prefix}{tag}2"
    for ns in (n1, n2):
        netns.delete_netns(ns)
        netns.create_netns(ns)
    netns.create_veth(
        n1, n2, f"{prefix}{tag}a", f"{prefix}{tag}b", addrs_a=[f"{subnet}.1/24"], addrs_b=[f"{subnet}.2/24"]
    )
    return Node(n1, f"{subnet}.1"), Node(n2, f"{subnet}.2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, action="append", help="message size (repeatable; default 1024)")
    ap.add_argument("-T", "--duration", type=float, default=4.0)
    ap.add_argument("--only", action="append", default=[], help="scenario label substring (repeatable)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--one-way", action="store_true", help="one-way cells (CPU per message sent)")
    ap.add_argument("--prefix", default="hop", help="namespace name prefix")
    ap.add_argument(
        "--tree",
        action="append",
        default=[],
        help="NAME=PATH: also measure userspace<->userspace with the pyrds tree at PATH",
    )
    args = ap.parse_args()
    for mod in ("rds", "rds_tcp"):
        subprocess.run(["modprobe", mod], check=False, capture_output=True)
    kk = _pair(args.prefix, "k", "10.81.0")
    scenarios: list[tuple[str, tuple[Node, Node], str, Path]] = [("kernel<->kernel", kk, "kernel", ROOT)]
    nodes = [*kk]
    # one namespace pair (and so one pair of stack services) per tree: this one, and each --tree
    trees = [("", ROOT)] + [(f" [{t.partition('=')[0]}]", Path(t.partition("=")[2])) for t in args.tree]
    for i, (name, tree) in enumerate(trees):
        uu = _pair(args.prefix, f"u{i}", f"10.82.{i}")
        for n in uu:
            userspace_node(n, USERSPACE_PORT)
            n.env["PYRDS_STACK_NAME"] = f"pyrds-hops-{i}"
        scenarios.append((f"userspace<->userspace{name}", uu, "userspace", tree))
        nodes += uu
    results = []
    try:
        for _ in range(args.repeat):
            for size in args.size or [1024]:
                for port, (label, (a, b), backend, tree) in enumerate(scenarios, start=4201):
                    if args.only and not any(o in label for o in args.only):
                        continue
                    row = cell(label, a, b, backend, size, args.duration, port, tree, args.one_way)
                    results.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        teardown(nodes)
    print("PYRDS-HOPS-JSON " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
