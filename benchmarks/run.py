"""pyrds benchmark: the kernel driven by stdlib sockets (the baseline), the kernel driven by pyrds.kernel,
userspace<->userspace, mixed and plain TCP over veth, plus the per-call cost of pyrds.kernel against the
stdlib (benchmarks/percall.py), fan-in, many sockets per process and memory per queued message
(benchmarks/sections.py), in ONE guest run.

Host:   ``python benchmarks/run.py``           boots the guest (python -m vm run), runs the guest phase, then
                                               writes docs/benchmarks.md and docs/benchmarks.png here.
Guest:  ``python benchmarks/run.py --guest``   (root + AF_RDS) prints one ``PYRDS-BENCH-JSON`` line.
Render: ``python benchmarks/run.py --from-json results.json``  rewrites the report from saved results.

``--sections`` picks what is measured (stress, fanin, many, mem, percall; default all); on the host,
``--merge`` keeps what --save-json already holds of the sections not measured this time, e.g.
``python benchmarks/run.py --kernel 7.3 --sections fanin,many,mem --merge``. ``--only`` (scenario label
substring) narrows every section.

Each stress cell is ``pyrds stress`` (active side in one netns, ``--passive --once`` in the other; for the
stdlib row the same stress code with stdlib sockets, benchmarks/stdlib_stress.py) or the plain TCP baseline
(benchmarks/tcp_baseline.py), request/response depth 1 and one-way, for every message size. The fan-in,
many-sockets and queued-memory cells are benchmarks/agent.py processes driven by benchmarks/sections.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from report import write_report  # noqa: E402
from topology import KERNEL_PORT, USERSPACE_PORT, Node, make_pair, teardown, userspace_node  # noqa: E402

MARK = "PYRDS-BENCH-JSON "
#: what --sections names, in the order a guest run measures them
SECTIONS = ("stress", "fanin", "many", "mem", "percall")
#: the results file's key of each newer section (absent in older files; the report says "not measured")
SECTION_KEYS = {"fanin": "fanin", "many": "many_sockets", "mem": "queued_memory"}
SIZES = (0, 1024, 8192, 65536)
PY = sys.executable
CLI = [PY, "-m", "pyrds.cli.main"]
STDLIB_CLI = [PY, str(HERE / "stdlib_stress.py")]


def _cli(backend: str) -> tuple[list[str], str]:
    """The stress command line and the --backend it gets (the stdlib row runs the CLI with stdlib sockets)."""
    if backend == "stdlib":
        return STDLIB_CLI, "kernel"
    return CLI, backend


# (label, active backend, passive backend, topology key); the first row is the baseline of every ratio
SCENARIOS = [
    ("kernel<->kernel (stdlib)", "stdlib", "stdlib", "kk"),
    ("kernel<->kernel (pyrds.kernel)", "kernel", "kernel", "kk"),
    ("userspace<->userspace", "userspace", "userspace", "uu"),
    ("userspace->kernel", "userspace", "kernel", "mixed-u2k"),
    ("kernel->userspace", "kernel", "userspace", "mixed-k2u"),
    ("plain TCP", "tcp", "tcp", "kk"),
]


def _wait_listening(proc: subprocess.Popen[str], timeout: float) -> None:
    assert proc.stderr is not None
    end = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            time.sleep(0.5)
            why = " | ".join(s.strip() for s in seen[-3:]) or "no output"
            raise RuntimeError(f"passive side exited ({proc.poll()}): {why}")
        if "passive on" in line:
            return
        seen.append(line)
    raise RuntimeError("passive side did not start")


class Passive:
    """One passive server per scenario (serves every cell: each active run says hello on a new socket)."""

    def __init__(self, node: Node, backend: str, port: int) -> None:
        if backend == "tcp":
            cmd = [PY, str(HERE / "tcp_baseline.py"), "--passive", "-s", node.addr, "-p", str(port)]
        else:
            cli, cli_backend = _cli(backend)
            cmd = [
                *cli,
                "stress",
                "--passive",
                "--json",
                "--backend",
                cli_backend,
                "-s",
                node.addr,
                "-p",
                str(port),
            ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.out = tempfile.TemporaryFile("w+")
        for attempt in range(3):
            self.proc = node.popen(cmd, stdout=self.out, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
            try:
                _wait_listening(self.proc, 120)
                return
            except RuntimeError as exc:
                # a loaded TCG guest can take longer than the client's 10 s to start the stack service;
                # the service keeps starting, so a second attempt finds it
                if "did not start" not in str(exc) or attempt == 2:
                    log = Path(node.env.get("PYRDS_STACK_LOG", "/nonexistent"))
                    tail = log.read_text(errors="replace").strip().splitlines()[-2:] if log.exists() else []
                    raise RuntimeError(f"{exc} {' | '.join(tail)}".strip()) from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


def one_cell(
    active: Node, passive: Node, backend: str, size: int, mode: str, dur: float, port: int
) -> dict[str, Any]:
    if backend == "tcp":
        acmd = [PY, str(HERE / "tcp_baseline.py"), "-s", active.addr, "-r", passive.addr, "-p", str(port)]
    else:
        cli, cli_backend = _cli(backend)
        acmd = [
            *cli,
            "stress",
            "--json",
            "--no-rows",
            "--backend",
            cli_backend,
            "-s",
            active.addr,
            "-r",
            passive.addr,
            "-p",
            str(port),
            "-W",
            "60",
        ]
    acmd += ["-q", str(size), "-T", str(dur)] + (["--one-way"] if mode == "oneway" else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile("w+") as aout, tempfile.TemporaryFile("w+") as aerr:
        cli = active.popen(acmd, stdout=aout, stderr=aerr, text=True, env=env, cwd=ROOT)
        try:
            cli.wait(dur + 300)
        except subprocess.TimeoutExpired:
            cli.kill()
            cli.wait()
        aout.seek(0)
        aerr.seek(0)
        out, err = aout.read(), aerr.read()
    try:
        doc: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return {"error": f"rc {cli.returncode}: {tail}"}
    if cli.returncode != 0:
        doc["error"] = "; ".join(doc.get("errors") or [f"rc {cli.returncode}"])
    return doc


def stress_cells(
    args: argparse.Namespace, selected: list[tuple[str, str, str, str]], topo: dict[str, tuple[Node, Node]]
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    # every scenario's passive server runs for the whole measurement, and the cells alternate between the
    # scenarios (for each mode and size: every scenario once), so that a load change on a shared host hits
    # all rows alike instead of one scenario's block of cells
    servers: dict[str, tuple[Passive | None, str | None, int]] = {}
    try:
        for port, (label, _ba, bp, key) in enumerate(selected, start=4001):
            try:
                servers[label] = (Passive(topo[key][1], bp, port), None, port)
            except RuntimeError as exc:
                servers[label] = (None, str(exc), port)
        for mode in args.modes:
            for size in args.sizes:
                for label, ba, _bp, key in selected:
                    a, p = topo[key]
                    server, err, port = servers[label]
                    t0 = time.monotonic()
                    if server is not None and not server.alive():
                        server, err = None, "passive side died"
                        servers[label] = (None, err, port)
                    doc = (
                        {"error": err}
                        if server is None
                        else one_cell(a, p, ba, size, mode, args.duration, port)
                    )
                    row = {"scenario": label, "mode": mode, "size": size, **_pick(doc)}
                    results.append(row)
                    print(
                        f"[bench] {label:22} {mode:6} {size:6} B: {row.get('msgs_per_s')} msgs/s "
                        f"{row.get('mb_per_s')} MB/s p50 {row.get('p50_us')} p99 {row.get('p99_us')} "
                        f"{row.get('error') or ''} ({time.monotonic() - t0:.0f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for server, _err, _port in servers.values():
            if server is not None:
                server.stop()
        order = {sc[0]: i for i, sc in enumerate(SCENARIOS)}
        results.sort(key=lambda r: (order[r["scenario"]], args.modes.index(r["mode"]), r["size"]))
    return results


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
    if want & {"stress", "fanin", "many"}:
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
        return {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(),
            "size": extra.SIZE,
            "sockbuf": extra.SOCKBUF,
            "nofile": nofile,
            **fields,
        }

    try:
        if "stress" in want:
            results = stress_cells(args, selected, topo)
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

        variants = {"stdlib": percall.stdlib_socket, "pyrds.kernel": percall.pyrds_socket}
        if args.percall_before:
            variants["before"] = percall.loaded_socket(args.percall_before)
        percall_rows = percall.measure(variants, args.percall_rounds, False)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "duration_s": args.duration,
        "results": results,
        "percall": percall_rows,
        **sections,
    }


def _pick(doc: dict[str, Any]) -> dict[str, Any]:
    rtt = doc.get("rtt_us") or {}
    return {
        "msgs_per_s": doc.get("msgs_per_s"),
        "mb_per_s": doc.get("mb_per_s"),
        "p50_us": rtt.get("p50"),
        "p99_us": rtt.get("p99"),
        "cpu_pct": doc.get("cpu_pct"),
        "error": doc.get("error"),
    }


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


def host_phase(args: argparse.Namespace) -> int:
    cmd = [
        PY,
        "-m",
        "vm",
        "run",
        "--timeout",
        str(args.vm_timeout),
        *(["--kernel", args.kernel] if args.kernel else []),
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
        "--many-sockets",
        ",".join(map(str, args.many_sockets)),
        "--mem-limit",
        str(args.mem_limit),
        "--section-seconds",
        str(args.section_seconds),
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
    Path(args.save_json).write_text(json.dumps(data, indent=1))
    write_report(data, Path(args.out), Path(args.png))
    print(f"wrote {args.out}, {args.png} and {args.save_json}", file=sys.stderr)
    return 0


def merge(data: dict[str, Any], previous: Path, measured: list[str]) -> dict[str, Any]:
    """``data`` plus what ``previous`` (a saved results file) has of the parts this run did not measure.

    The stress rows and the per-call table are one part (they share the top-level date, machine and note);
    each new section (fan-in, many sockets, queued memory) carries its own date and machine."""
    if not previous.exists():
        return data
    old = json.loads(previous.read_text())
    out = dict(data)
    if not {"stress", "percall"} & set(measured):
        for key in ("date", "machine", "duration_s", "results", "percall", "note", "kernel"):
            if key in old:
                out[key] = old[key]
            else:
                out.pop(key, None)
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
    ap.add_argument("--fanin-senders", type=int, default=8, help="fan-in: sender processes (8)")
    ap.add_argument(
        "--many-sockets", type=_int_list, default=[1, 64, 512], help="many sockets: N per row (1,64,512)"
    )
    ap.add_argument("--mem-limit", type=int, default=2000, help="queued memory: messages at most (2000)")
    ap.add_argument(
        "--section-seconds", type=float, default=5.0, help="fan-in and many-sockets: seconds of sending (5)"
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
