"""Guest side of the fan-in, many-sockets and queued-memory rows (``run.py --guest --sections ...``).

Every cell starts fresh agent processes (benchmarks/agent.py) in the namespaces of benchmarks/topology.py and
drives them over their stdin/stdout; each cell has its own receiving port, so a late message of one cell can
never be counted by the next.

- fan-in: one ``count`` receiver in node B, ``senders`` ``send -n 1`` processes in node A; all senders are
  ready (socket bound) before one "go" line starts them; they send one-way for ``seconds`` and keep their
  sockets open until the receiver has been idle for 1 s. The rate is the receiver's: messages received /
  (last arrival - first arrival).
- many sockets: one ``send -n N`` process (N sockets bound to (A, 0): distinct ports chosen by bind, counted)
  sending round-robin, one socket after the other, waiting on a socket that has no space; the same receiver
  and rate. ``open_bind_s`` is the wall time of the N ``socket()`` + ``bind()`` calls only (an untimed socket
  is opened and closed first, so a userspace stack service that idled out starts outside the timing).
- queued memory: fresh node pairs (``qk`` kernel, ``qu`` userspace; a fresh stack service has no freed heap
  left over from the other cells to hide growth in); a ``hold`` receiver that does not read and a ``fill``
  sender. 20 warm-up messages are sent and read (the RDS connection exists before the baseline), two
  baseline snapshots 1 s apart (their difference is the idle noise), the non-blocking fill (first EAGAIN or
  ENOBUFS, or ``limit``), a wait until the receive queue holds what was sent (or stood still 3 s), a
  snapshot, a drain (read back and counted), a last snapshot.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from topology import Node

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
SIZE = 1024
SOCKBUF = 4 << 20
#: (label, sender backend, receiver backend, topology key): the queued-memory rows. The receiver is what is
#: measured; pyrds.kernel and the mixed scenarios have the same two receivers (kernel, userspace stack).
MEM_SCENARIOS = [
    ("kernel<->kernel (stdlib)", "stdlib", "stdlib", "qk"),
    ("userspace<->userspace", "userspace", "userspace", "qu"),
]

Scenario = tuple[str, str, str, str]


class AgentError(RuntimeError):
    pass


class Agent:
    """One benchmarks/agent.py process in a node: JSON lines out, command lines in."""

    def __init__(self, node: Node, role: str, backend: str, args: Sequence[str]) -> None:
        cmd = [PY, str(HERE / "agent.py"), role, "--backend", backend, *args]
        self.what = f"{role} ({backend}) in {node.ns}"
        self.err = tempfile.TemporaryFile("w+")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = node.popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            bufsize=1,
            env=env,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _tail(self) -> str:
        try:
            self.err.seek(0)
            lines = self.err.read().strip().splitlines()
        except (OSError, ValueError):
            return ""
        return f": {lines[-1].strip()}" if lines else ""

    def expect(self, key: str, timeout: float) -> dict[str, Any]:
        """The next JSON line that has ``key``; an agent-reported error or a timeout raises AgentError."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AgentError(f"{self.what}: no {key!r} within {timeout:g} s{self._tail()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                time.sleep(0.2)
                raise AgentError(f"{self.what} exited ({self.proc.poll()}){self._tail()}")
            try:
                doc: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if key in doc:
                return doc
            if doc.get("error"):
                raise AgentError(f"{self.what}: {doc['error']}")

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise AgentError(f"{self.what} is gone ({self.proc.poll()}){self._tail()}") from exc

    def close(self, timeout: float = 30.0) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def _close_all(agents: list[Agent]) -> None:
    for ag in agents:  # stdin EOF first for all: senders close their sockets in parallel
        try:
            if ag.proc.stdin is not None:
                ag.proc.stdin.close()
        except OSError:
            pass
    for ag in agents:
        ag.close()


def _log(text: str, t0: float) -> None:
    print(f"[bench] {text} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)


def _flow(
    a: Node, p: Node, ba: str, bp: str, port: int, processes: int, sockets: int, seconds: float
) -> dict[str, Any]:
    """``processes`` senders of ``sockets`` sockets each in ``a`` -> one receiver in ``p``, one-way."""
    agents: list[Agent] = []
    try:
        recv = Agent(p, "count", bp, ["-s", p.addr, "-p", str(port), "-q", str(SIZE)])
        agents.append(recv)
        recv.expect("ready", 180)
        opts = ["-s", a.addr, "-r", p.addr, "-p", str(port), "-q", str(SIZE), "-T", str(seconds)]
        senders = [Agent(a, "send", ba, [*opts, "-n", str(sockets)]) for _ in range(processes)]
        agents += senders
        ready = [s.expect("ready", 600) for s in senders]
        for s in senders:
            s.tell("go")
        done = [s.expect("sent", seconds + 180) for s in senders]
        recv.tell("stop")
        got = recv.expect("received", 180)
    except AgentError as exc:
        return {"error": str(exc)}
    finally:
        _close_all(agents)
    errors = [d["error"] for d in done if d.get("error")]
    rate = got.get("msgs_per_s")
    row: dict[str, Any] = {
        "sent": sum(int(d["sent"]) for d in done),
        "received": got["received"],
        "seconds": got["seconds"],
        "msgs_per_s": rate,
        "mb_per_s": round(rate * SIZE / 1e6, 3) if rate else None,
        "open_bind_s": max(float(r["open_bind_s"]) for r in ready),
        "distinct_ports": sum(int(r["distinct_ports"]) for r in ready),
        "error": "; ".join(errors) or (None if got["received"] else "nothing received"),
    }
    return row


def fanin(
    scenarios: Sequence[Scenario],
    topo: dict[str, tuple[Node, Node]],
    ports: Any,
    senders: int,
    seconds: float,
) -> list[dict[str, Any]]:
    rows = []
    for label, ba, bp, key in scenarios:
        t0 = time.monotonic()
        a, p = topo[key]
        row = {"scenario": label, "senders": senders, **_flow(a, p, ba, bp, next(ports), senders, 1, seconds)}
        rows.append(row)
        _log(f"fan-in {label:30} {senders} -> 1: {row.get('msgs_per_s')} msgs/s {row.get('error') or ''}", t0)
    return rows


def many_sockets(
    scenarios: Sequence[Scenario],
    topo: dict[str, tuple[Node, Node]],
    ports: Any,
    counts: Sequence[int],
    seconds: float,
) -> list[dict[str, Any]]:
    rows = []
    for n in counts:  # every scenario once per N, so that a load change hits all rows of an N alike
        for label, ba, bp, key in scenarios:
            t0 = time.monotonic()
            a, p = topo[key]
            row = {"scenario": label, "sockets": n, **_flow(a, p, ba, bp, next(ports), 1, n, seconds)}
            rows.append(row)
            _log(
                f"many    {label:30} N={n}: open+bind {row.get('open_bind_s')} s, {row.get('msgs_per_s')} "
                f"msgs/s {row.get('error') or ''}",
                t0,
            )
    return rows


def _delta(s: dict[str, Any], t: dict[str, Any], get: Callable[[dict[str, Any]], Any]) -> Any:
    try:
        a, b = get(s), get(t)
    except (KeyError, TypeError):
        return None
    return None if a is None or b is None else b - a


def _accounted(snap: dict[str, Any]) -> int | None:
    c = snap["counters"]
    added, freed = c.get("recv_bytes_added_to_sock"), c.get("recv_bytes_freed_fromsock")
    return None if added is None or freed is None else added - freed


def _rss(snap: dict[str, Any]) -> int | None:
    kb = snap.get("service_kb")
    return kb["VmRSS"] if kb else None


def memory_cell(a: Node, p: Node, ba: str, bp: str, port: int, limit: int) -> dict[str, Any]:
    agents: list[Agent] = []
    try:
        recv = Agent(p, "hold", bp, ["-s", p.addr, "-p", str(port), "-q", str(SIZE)])
        agents.append(recv)
        recv.expect("ready", 180)
        send = Agent(a, "fill", ba, ["-s", a.addr, "-r", p.addr, "-p", str(port), "-q", str(SIZE)])
        agents.append(send)
        send.expect("ready", 180)
        send.tell("warm 20")
        send.expect("warm", 120)
        recv.tell("drain")
        warm = recv.expect("drained", 120)["drained"]
        recv.tell("snap")
        s0 = recv.expect("snap", 60)["snap"]
        time.sleep(1.0)
        recv.tell("snap")
        s1 = recv.expect("snap", 60)["snap"]
        send.tell(f"fill {limit}")
        filled = send.expect("fill", 120)["fill"]
        recv.tell(f"settle {filled['sent']}")
        settled = recv.expect("settled", 120)["settled"]
        recv.tell("snap")
        s2 = recv.expect("snap", 60)["snap"]
        recv.tell("drain")
        drained = recv.expect("drained", 120)["drained"]
        recv.tell("snap")
        s3 = recv.expect("snap", 60)["snap"]
    except AgentError as exc:
        return {"error": str(exc)}
    finally:
        _close_all(agents)

    def memfree(s: dict[str, Any]) -> int:
        return int(s["meminfo_kb"]["MemFree"])

    def slab(s: dict[str, Any]) -> int:
        return int(s["meminfo_kb"]["Slab"])

    return {
        "receiver": "userspace" if bp == "userspace" else "kernel",
        "limit": limit,
        "warm": 20,
        "warm_drained": warm,
        "sent": filled["sent"],
        "stop": filled["stop"],
        "settle_s": settled["waited_s"],
        "queued": s2["queued"],
        "drained": drained,
        "accounted_bytes": _delta(s1, s2, _accounted),
        "memfree_drop_kb": _delta(s2, s1, memfree),
        "slab_growth_kb": _delta(s1, s2, slab),
        "idle_memfree_drop_kb": _delta(s1, s0, memfree),
        "idle_slab_growth_kb": _delta(s0, s1, slab),
        "rss_growth_kb": _delta(s1, s2, _rss),
        "idle_rss_growth_kb": _delta(s0, s1, _rss),
        "rss_after_drain_kb": _delta(s1, s3, _rss),
        "memfree_drop_after_drain_kb": _delta(s3, s1, memfree),
        "service_pids": s2.get("service_pids"),
        "snaps": [s0, s1, s2, s3],
        "error": None if s2["queued"] else "nothing queued",
    }


def queued_memory(
    topo: dict[str, tuple[Node, Node]], ports: Any, only: Sequence[str] | None, limit: int
) -> list[dict[str, Any]]:
    rows = []
    for label, ba, bp, key in MEM_SCENARIOS:
        if only and not any(o in label for o in only):
            continue
        t0 = time.monotonic()
        a, p = topo[key]
        row = {"scenario": label, **memory_cell(a, p, ba, bp, next(ports), limit)}
        rows.append(row)
        _log(
            f"memory  {label:30} sent {row.get('sent')} ({row.get('stop')}), queued {row.get('queued')}, "
            f"rss +{row.get('rss_growth_kb')} kB, MemFree -{row.get('memfree_drop_kb')} kB "
            f"{row.get('error') or ''}",
            t0,
        )
    return rows


def port_counter(start: int = 4101) -> Any:
    return itertools.count(start)
