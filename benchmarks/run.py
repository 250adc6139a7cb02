"""pyrds benchmark: the kernel driven by stdlib sockets (the baseline), the kernel driven by pyrds.kernel,
userspace<->userspace, mixed and plain TCP over veth, plus the per-call cost of pyrds.kernel against the
stdlib (benchmarks/percall.py), fan-in, many sockets per process and memory per queued message
(benchmarks/sections.py), the process-structure floor (benchmarks/floor.py), and the same stress cells over
RDS/IB on rdma_rxe (soft-RoCE on a dummy netdev in the initial namespace; benchmarks/ib_section.py), in ONE
guest run.

Host:   ``python benchmarks/run.py``           boots the guest (python -m vm run), runs the guest phase, then
                                               writes docs/benchmarks.md and docs/benchmarks.png here.
Guest:  ``python benchmarks/run.py --guest``   (root + AF_RDS) prints one ``PYRDS-BENCH-JSON`` line.
Render: ``python benchmarks/run.py --from-json results.json``  rewrites the report from saved results.

``--sections`` picks what is measured (stress, targets, fanin, many, mem, percall, floor, ib; default
all); on the host, ``--merge`` keeps what --save-json already holds of the sections not measured this
time, e.g. ``python benchmarks/run.py --kernel 7.3 --sections fanin,many,mem --merge``. ``--only``
(scenario label substring) narrows every section. The report is always rendered whole from the saved
results: a remark on a section goes in with ``--note`` or into that section's ``note`` field of the
results file, never into the markdown by hand (the next run would drop it;
tests/unit/test_benchmarks_report_sync.py checks the committed pair).

Each stress cell is ``pyrds stress`` (active side in one netns, ``--passive --once`` in the other; for the
stdlib row the same stress code with stdlib sockets, benchmarks/stdlib_stress.py) or the plain TCP baseline
(benchmarks/tcp_baseline.py), request/response depth 1 and one-way, for every message size. The fan-in,
many-sockets and queued-memory cells are benchmarks/agent.py processes driven by benchmarks/sections.py.
The IB section (``--ib-sizes``, default the stress sizes) runs last: kernel<->kernel (stdlib, pyrds.kernel),
userspace<->userspace and userspace->kernel between two addresses of one rxe device (pyrds.testing.ib's
fabric and pairings), every socket pinned with ``pyrds stress --transport ib``; userspace<->userspace first,
with rds_rdma unloaded, before the kernel had any RDS/IB connection (ib_section.py says why); and
kernel->userspace across two guests: with the ib section the host boots a second, 1-vCPU guest (``vm run
--peer-ib``; ``--no-ib-peer`` leaves it and that row out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from cells import measure_cells  # noqa: E402
from report import write_report  # noqa: E402
from topology import KERNEL_PORT, USERSPACE_PORT, Node, make_pair, teardown, userspace_node  # noqa: E402

MARK = "PYRDS-BENCH-JSON "
#: what --sections names, in the order a guest run measures them
SECTIONS = ("stress", "targets", "fanin", "many", "mem", "percall", "floor", "ib")
#: the results file's key of each newer section (absent in older files; the report says "not measured")
SECTION_KEYS = {
    "targets": "targets",
    "fanin": "fanin",
    "many": "many_sockets",
    "mem": "queued_memory",
    "floor": "floor",
    "ib": "ib",
}
SIZES = (0, 1024, 8192, 65536)
#: the targets section's cells (issue 10: request/response 1 KiB and one-way 64 KiB; the other two come free)
TARGET_MODES = ("rr", "oneway")
TARGET_SIZES = (1024, 65536)
PY = sys.executable


# (label, active backend, passive backend, topology key); the first row is the baseline of every ratio
SCENARIOS = [
    ("kernel<->kernel (stdlib)", "stdlib", "stdlib", "kk"),
    ("kernel<->kernel (pyrds.kernel)", "kernel", "kernel", "kk"),
    ("userspace<->userspace", "userspace", "userspace", "uu"),
    ("userspace->kernel", "userspace", "kernel", "mixed-u2k"),
    ("kernel->userspace", "kernel", "userspace", "mixed-k2u"),
    ("plain TCP", "tcp", "tcp", "kk"),
]


def guest_phase(args: argparse.Namespace) -> dict[str, Any]:
    import sections as extra

    for mod in ("rds", "rds_tcp"):
        subprocess.run(["modprobe", mod], check=False)
    # the many-sockets rows open 512 sockets in one process (userspace: 512 control connections, and as many
    # in the stack service): every process started from here inherits the raised soft limit
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    want = set(args.sections)
    selected = [sc for sc in SCENARIOS if not args.only or any(o in sc[0] for o in args.only)]
    rds_selected = [sc for sc in selected if sc[1] != "tcp"]
    topo: dict[str, tuple[Node, Node]] = {}
    nodes: list[Node] = []
    if want & {"stress", "targets", "fanin", "many"}:
        kk = make_pair("kk", "10.91.0")
        uu = make_pair("uu", "10.92.0")
        mk, mu = make_pair("mx", "10.93.0")
        for n in uu:
            userspace_node(n, USERSPACE_PORT)
        userspace_node(mu, KERNEL_PORT)
        topo.update({"kk": kk, "uu": uu, "mixed-u2k": (mu, mk), "mixed-k2u": (mk, mu)})
        nodes += [*kk, *uu, mk, mu]
    if "mem" in want:
        # fresh pairs: a new stack service holds no freed heap from the other cells to hide growth in
        qk = make_pair("qk", "10.94.0")
        qu = make_pair("qu", "10.95.0")
        for n in qu:
            userspace_node(n, USERSPACE_PORT)
        topo.update({"qk": qk, "qu": qu})
        nodes += [*qk, *qu]
    results: list[dict[str, Any]] = []
    sections: dict[str, Any] = {}
    ports = extra.port_counter()

    def meta(**fields: Any) -> dict[str, Any]:
        return stamped(size=extra.SIZE, sockbuf=extra.SOCKBUF, nofile=nofile, **fields)

    try:
        if "stress" in want:
            results = measure_cells(selected, topo, args.modes, args.sizes, args.duration)
        if "targets" in want and args.targets_repeat > 0:
            rows = []
            for rep in range(args.targets_repeat):
                got = measure_cells(
                    rds_selected,
                    topo,
                    list(TARGET_MODES),
                    list(TARGET_SIZES),
                    args.targets_seconds,
                    port_base=4201 + 10 * rep,
                    tag=f"targets {rep + 1}/{args.targets_repeat} ",
                )
                rows += [{**r, "rep": rep} for r in got]
            sections["targets"] = stamped(seconds=args.targets_seconds, repeat=args.targets_repeat, rows=rows)
        if "fanin" in want:
            rows = extra.fanin(rds_selected, topo, ports, args.fanin_senders, args.section_seconds)
            sections["fanin"] = meta(senders=args.fanin_senders, seconds=args.section_seconds, rows=rows)
        if "many" in want:
            rows = extra.many_sockets(rds_selected, topo, ports, args.many_sockets, args.section_seconds)
            sections["many_sockets"] = meta(
                sockets=args.many_sockets, seconds=args.section_seconds, rows=rows
            )
        if "mem" in want:
            rows = extra.queued_memory(topo, ports, args.only, args.mem_limit)
            sections["queued_memory"] = meta(limit=args.mem_limit, rows=rows)
    finally:
        teardown(nodes)
    percall_rows: list[dict[str, Any]] = []
    if "percall" in want and args.percall_rounds > 0:
        import percall

        variants = {
            "stdlib": percall.stdlib_socket,
            "floor": percall.floor_socket,
            "pyrds.kernel": percall.pyrds_socket,
        }
        if args.percall_before:
            variants["before"] = percall.loaded_socket(args.percall_before)
        percall_rows = percall.measure(variants, args.percall_rounds, False)
    if "floor" in want and args.floor_repeat > 0:
        import floor

        sections["floor"] = stamped(
            seconds=args.duration,
            repeat=args.floor_repeat,
            rows=floor.measure(args.duration, args.floor_repeat),
        )
    if "ib" in want:
        # last: it unloads and reloads rds_rdma and leaves kernel RDS/IB connections behind (ib_section.py)
        import ib_section

        for mod in ("rds_rdma", "rdma_rxe"):
            subprocess.run(["modprobe", mod], check=False)
        chosen = [sc for sc in ib_section.IB_SCENARIOS if not args.only or any(o in sc[0] for o in args.only)]
        chosen, unavailable = ib_section.available(chosen)
        got = ib_section.measure(chosen, args.modes, args.ib_sizes, args.duration)
        got["unavailable"] = unavailable
        sections["ib"] = stamped(duration_s=args.duration, sizes=args.ib_sizes, modes=args.modes, **got)
    return stamped(duration_s=args.duration, results=results, percall=percall_rows, **sections)


def stamped(**fields: Any) -> dict[str, Any]:
    """``fields`` after the time and the machine they were measured on (each section's head, the run's)."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), **fields}


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"Linux {platform.release()} {platform.machine()}, {os.cpu_count()} vCPU ({model}), "
        f"Python {platform.python_version()}"
    )


def peer_args() -> list[str]:
    """``vm run`` options for the second guest of the RDS/IB kernel->userspace row (guest B: its userspace
    stack behind the peer agent, vm/ib_peer.py; 1 vCPU, idle until that row runs; guest A keeps 2)."""
    return ["--peer-ib", "--peer-cmd", "python -m vm.ib_peer"]


def host_phase(args: argparse.Namespace) -> int:
    cmd = [
        PY,
        "-m",
        "vm",
        "run",
        "--timeout",
        str(args.vm_timeout),
        *(["--kernel", args.kernel] if args.kernel else []),
        *(peer_args() if "ib" in args.sections and not args.no_ib_peer else []),
        "--",
        "python",
        "benchmarks/run.py",
        "--guest",
        "-T",
        str(args.duration),
        "--sizes",
        ",".join(map(str, args.sizes)),
        "--modes",
        ",".join(args.modes),
        "--percall-rounds",
        str(args.percall_rounds),
        "--sections",
        ",".join(args.sections),
        "--fanin-senders",
        str(args.fanin_senders),
        "--targets-repeat",
        str(args.targets_repeat),
        "--targets-seconds",
        str(args.targets_seconds),
        "--many-sockets",
        ",".join(map(str, args.many_sockets)),
        "--mem-limit",
        str(args.mem_limit),
        "--section-seconds",
        str(args.section_seconds),
        "--floor-repeat",
        str(args.floor_repeat),
        "--ib-sizes",
        ",".join(map(str, args.ib_sizes)),
    ]
    if args.percall_before:
        cmd += ["--percall-before", args.percall_before]
    for o in args.only or []:
        cmd += ["--only", o]
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    data: dict[str, Any] | None = None
    accel = ""
    for line in proc.stdout:
        if MARK in line:
            data = json.loads(line.split(MARK, 1)[1])
            continue
        if line.startswith("[vm] kernel") and "accel" in line:
            accel = line.split("accel", 1)[1].split("(")[0].strip()
        sys.stderr.write(line)
        sys.stderr.flush()
    rc = proc.wait()
    if data is None:
        print(f"benchmark: no results from the guest (vm run exit {rc})", file=sys.stderr)
        return 1
    note = args.note or f"host 1-min load average at the end of the run: {os.getloadavg()[0]:.1f}"
    for part in [data, *(data[k] for k in SECTION_KEYS.values() if k in data)]:
        if accel:
            part["machine"] += f"; QEMU guest, accel {accel}"
        part["note"] = note
        part["kernel"] = part.get("kernel") or part["machine"].split(" ", 2)[1]
    if args.merge:
        data = merge(data, Path(args.save_json), args.sections)
    # the chart draws the stress rows: a merged run without them keeps the last drawing (whatever drew it);
    # a run that is not merged has no drawing to keep, and write_report draws one
    write_report(data, Path(args.out), Path(args.png), chart="stress" in args.sections)
    Path(args.save_json).write_text(json.dumps(data, indent=1))
    print(f"wrote {args.out}, {args.png} and {args.save_json}", file=sys.stderr)
    return 0


def merge(data: dict[str, Any], previous: Path, measured: list[str]) -> dict[str, Any]:
    """``data`` plus what ``previous`` (a saved results file) has of the parts this run did not measure.

    The stress rows and the per-call table are one part (they share the top-level date, machine and note);
    each new section (fan-in, many sockets, queued memory, IB) carries its own date and machine."""
    if not previous.exists():
        return data
    old = json.loads(previous.read_text())
    out = dict(data)
    if not {"stress", "percall"} & set(measured):
        for key in ("date", "machine", "duration_s", "results", "percall", "percall_run", "note", "kernel"):
            if key in old:
                out[key] = old[key]
            else:
                out.pop(key, None)
    elif "stress" not in measured:
        # the per-call table alone: the stress rows (and the top-level date, machine and note they go
        # with) stay; this run's own date, machine and note go with the table
        out["percall_run"] = {k: data[k] for k in ("date", "machine", "note", "kernel") if k in data}
        for key in ("date", "machine", "duration_s", "results", "note", "kernel"):
            if key in old:
                out[key] = old[key]
    elif "percall" not in measured:
        for key in ("percall", "percall_run"):
            if key in old:
                out[key] = old[key]
    if "stress" not in measured and "chart" in old:
        out["chart"] = old["chart"]  # what drew the chart of the stress rows kept (write_report)
    for section, key in SECTION_KEYS.items():
        if section not in measured and key in old:
            out[key] = old[key]
    return out


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _sections(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"sections are a comma list of {', '.join(SECTIONS)}")
    return [n for n in SECTIONS if n in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guest", action="store_true", help="run the measurements here (root, AF_RDS)")
    ap.add_argument("--from-json", help="render the report from saved results")
    ap.add_argument("-T", "--duration", type=float, default=3.0, help="seconds per cell (3)")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SIZES))
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["rr", "oneway"])
    ap.add_argument("--only", action="append", help="scenario label substring (repeatable)")
    ap.add_argument(
        "--percall-rounds", type=int, default=30, help="per-call benchmark batches per cell (30; 0 = skip)"
    )
    ap.add_argument(
        "--percall-only", action="store_true", help="only the per-call benchmark (= --sections percall)"
    )
    ap.add_argument(
        "--sections",
        type=_sections,
        default=list(SECTIONS),
        help=f"what to measure, a comma list of {','.join(SECTIONS)} (default: all)",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="host: keep what --save-json already holds of the sections this run does not measure",
    )
    ap.add_argument(
        "--targets-repeat", type=int, default=3, help="targets: interleaved passes over the target cells (3)"
    )
    ap.add_argument("--targets-seconds", type=float, default=5.0, help="targets: seconds per cell (5)")
    ap.add_argument("--fanin-senders", type=int, default=8, help="fan-in: sender processes (8)")
    ap.add_argument(
        "--many-sockets", type=_int_list, default=[1, 64, 512], help="many sockets: N per row (1,64,512)"
    )
    ap.add_argument("--mem-limit", type=int, default=2000, help="queued memory: messages at most (2000)")
    ap.add_argument(
        "--section-seconds", type=float, default=5.0, help="fan-in and many-sockets: seconds of sending (5)"
    )
    ap.add_argument(
        "--floor-repeat", type=int, default=3, help="floor: alternating repeats of each cell (3; 0 = skip)"
    )
    ap.add_argument(
        "--ib-sizes",
        type=_int_list,
        default=list(SIZES),
        help="IB section: message sizes (default: the stress sizes, 0,1024,8192,65536)",
    )
    ap.add_argument(
        "--percall-before",
        help="per-call column 'before': a file with another kernel RDSSocket (e.g. an older socket.py)",
    )
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--png", default=str(ROOT / "docs" / "benchmarks.png"))
    ap.add_argument("--save-json", default=str(ROOT / "benchmarks" / "results.json"))
    ap.add_argument("--note", help="a remark printed in the report (e.g. what else loaded the host)")
    ap.add_argument("--vm-timeout", type=float, default=3000.0)
    ap.add_argument(
        "--no-ib-peer",
        action="store_true",
        help="with the ib section: no second guest (vm run --peer-ib), so no kernel->userspace RDS/IB rows",
    )
    ap.add_argument("--kernel", help="guest kernel for python -m vm run (6.1, 6.12, 7.3; default: vm's)")
    args = ap.parse_args(argv)
    if args.percall_only:
        args.sections = ["percall"]
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        if args.note:
            data["note"] = args.note
        write_report(data, Path(args.out), Path(args.png))
        return 0
    if args.guest:
        data = guest_phase(args)
        print(MARK + json.dumps(data), flush=True)
        rows = [
            *data["results"],
            *(r for k in SECTION_KEYS.values() for r in data.get(k, {}).get("rows", [])),
        ]
        return 0 if all(not r.get("error") for r in rows) else 1
    return host_phase(args)


if __name__ == "__main__":
    sys.exit(main())
