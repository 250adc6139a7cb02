"""One stress cell of the benchmark: a ``pyrds stress --passive`` server per scenario (:class:`Passive`) and
one active ``pyrds stress`` run against it (:func:`one_cell`), or the plain TCP baseline's pair
(benchmarks/tcp_baseline.py); the stdlib row runs the same stress code with stdlib sockets
(benchmarks/stdlib_stress.py). ``transport`` (``"ib"``, ``"tcp"``) is passed on as ``--transport``: every
socket of both sides is pinned with SO_RDS_TRANSPORT before it binds. Used by run.py (RDS/TCP between
namespaces) and ib_section.py (RDS/IB over rxe in the initial namespace).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topology import Node

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
CLI = [PY, "-m", "pyrds.cli.main"]
STDLIB_CLI = [PY, str(HERE / "stdlib_stress.py")]


def cli_for(backend: str) -> tuple[list[str], str]:
    """The stress command line and the --backend it gets (the stdlib row runs the CLI with stdlib sockets)."""
    if backend == "stdlib":
        return STDLIB_CLI, "kernel"
    return CLI, backend


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

    def __init__(self, node: Node, backend: str, port: int, transport: str | None = None) -> None:
        if backend == "tcp":
            cmd = [PY, str(HERE / "tcp_baseline.py"), "--passive", "-s", node.addr, "-p", str(port)]
        else:
            cli, cli_backend = cli_for(backend)
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
                *transport_args(transport),
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


class PeerPassive:
    """The passive side on a node in another guest (:attr:`Node.agent`): a userspace socket of that guest's
    peer agent, pinned and bound as ``pyrds stress --passive`` does, served by the agent job
    :func:`pyrds.testing.workloads.stress_passive` (the same serving loop) until :meth:`stop`."""

    def __init__(self, node: Node, backend: str, port: int, transport: str | None, seconds: float) -> None:
        from pyrds.constants import SOL_RDS, SockOpt
        from pyrds.constants import Transport as TransportType

        if backend != "userspace":
            raise RuntimeError(f"a peer guest's node runs the userspace stack, not {backend!r}")
        self.agent = node.agent
        self.sock = self.agent.socket(backend)
        if transport:
            self.sock.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType[transport.upper()]))
        self.sock.bind((node.addr, port))
        self.job = self.agent.job("pyrds.testing.workloads:stress_passive", [self.sock], seconds=seconds)
        self.done = False

    def alive(self) -> bool:
        return not self.done and self.agent.broken is None

    def stop(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.agent.wait(self.agent.job("pyrds.testing.workloads:stress_passive_stop", [self.sock]), 30.0)
            self.agent.wait(self.job, 60.0)
        finally:
            self.sock.close()


def start_passive(node: Node, backend: str, port: int, transport: str | None, seconds: float) -> Any:
    """The passive side of a scenario on ``node``: a ``pyrds stress --passive`` process there, or, for a
    node in another guest, :class:`PeerPassive` (serving for at most ``seconds``)."""
    if node.agent is not None:
        return PeerPassive(node, backend, port, transport, seconds)
    return Passive(node, backend, port, transport)


def transport_args(transport: str | None) -> list[str]:
    """``pyrds stress`` arguments that pin every socket to ``transport`` (none: unpinned)."""
    return ["--transport", transport] if transport else []


def one_cell(
    active: Node,
    passive: Node,
    backend: str,
    size: int,
    mode: str,
    dur: float,
    port: int,
    transport: str | None = None,
) -> dict[str, Any]:
    if backend == "tcp":
        acmd = [PY, str(HERE / "tcp_baseline.py"), "-s", active.addr, "-r", passive.addr, "-p", str(port)]
    else:
        cli, cli_backend = cli_for(backend)
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
            *transport_args(transport),
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


def pick(doc: dict[str, Any]) -> dict[str, Any]:
    rtt = doc.get("rtt_us") or {}
    return {
        "msgs_per_s": doc.get("msgs_per_s"),
        "mb_per_s": doc.get("mb_per_s"),
        "p50_us": rtt.get("p50"),
        "p99_us": rtt.get("p99"),
        "cpu_pct": doc.get("cpu_pct"),
        "error": doc.get("error"),
    }


Scenario = tuple[str, str, str, str]  # (label, active backend, passive backend, topology key)


def measure_cells(
    selected: Sequence[Scenario],
    topo: dict[str, tuple[Node, Node]],
    modes: Sequence[str],
    sizes: Sequence[int],
    duration: float,
    *,
    port_base: int = 4001,
    transport: str | None = None,
    broken: dict[str, str] | None = None,
    tag: str = "",
) -> list[dict[str, Any]]:
    """One row per scenario, mode and size: ``topo[key]`` is (active node, passive node); a topology key in
    ``broken`` (key -> why) gives every cell of its scenarios that error. Rows come back in ``selected``
    order, then mode, then size."""
    results: list[dict[str, Any]] = []
    broken = broken or {}
    # every scenario's passive server runs for the whole measurement, and the cells alternate between the
    # scenarios (for each mode and size: every scenario once), so that a load change on a shared host hits
    # all rows alike instead of one scenario's block of cells
    servers: dict[str, tuple[Any, str | None, int]] = {}
    #: how long a peer guest's passive side may serve: every cell of this call, with room to spare
    serving = min(7200.0, 120.0 + len(modes) * len(sizes) * len(selected) * (duration + 120.0))
    try:
        for port, (label, _ba, bp, key) in enumerate(selected, start=port_base):
            if key in broken:
                servers[label] = (None, broken[key], port)
                continue
            try:
                servers[label] = (start_passive(topo[key][1], bp, port, transport, serving), None, port)
            except (RuntimeError, OSError) as exc:
                servers[label] = (None, str(exc), port)
        for mode in modes:
            for size in sizes:
                for label, ba, _bp, key in selected:
                    server, err, port = servers[label]
                    t0 = time.monotonic()
                    if server is not None and not server.alive():
                        server, err = None, "passive side died"
                        servers[label] = (None, err, port)
                    if server is None:
                        doc: dict[str, Any] = {"error": err}
                    else:
                        a, p = topo[key]
                        doc = one_cell(a, p, ba, size, mode, duration, port, transport)
                    row = {"scenario": label, "mode": mode, "size": size, **pick(doc)}
                    results.append(row)
                    print(
                        f"[bench] {tag}{label:22} {mode:6} {size:6} B: {row.get('msgs_per_s')} msgs/s "
                        f"{row.get('mb_per_s')} MB/s p50 {row.get('p50_us')} p99 {row.get('p99_us')} "
                        f"{row.get('error') or ''} ({time.monotonic() - t0:.0f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for server, _err, _port in servers.values():
            if server is not None:
                server.stop()
        order = {sc[0]: i for i, sc in enumerate(selected)}
        results.sort(key=lambda r: (order[r["scenario"]], list(modes).index(r["mode"]), r["size"]))
    return results
