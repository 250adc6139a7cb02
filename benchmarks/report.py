"""Render benchmark results: docs/benchmarks.md (Markdown tables) and a PNG chart.

The chart uses matplotlib when it is importable; otherwise a plain bar chart (no text) is written with the
stdlib (zlib + struct), and the Markdown says which.
"""

from __future__ import annotations

import statistics
import struct
import zlib
from pathlib import Path
from typing import Any

BASE = "kernel<->kernel (stdlib)"  # the kernel driven by plain stdlib sockets: every ratio is against it
PYRDS_KERNEL = "kernel<->kernel (pyrds.kernel)"
COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]


def _fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _table(rows: list[dict[str, Any]], mode: str) -> list[str]:
    base = {r["size"]: r for r in rows if r["scenario"] == BASE and r["mode"] == mode}
    head = "| path | size | msgs/s | MB/s | p50 rtt us | p99 rtt us | vs stdlib kernel |"
    if mode != "rr":
        head = "| path | size | msgs/s | MB/s | vs stdlib kernel |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["mode"] != mode:
            continue
        b = base.get(r["size"], {})
        ratio = "-"
        if r.get("msgs_per_s") and b.get("msgs_per_s"):
            ratio = f"{r['msgs_per_s'] / b['msgs_per_s']:.2f}x"
        size = f"{r['size'] // 1024} KiB" if r["size"] >= 1024 else f"{r['size']} B"
        if r.get("error"):
            cells = [r["scenario"], size, f"failed: {r['error']}"] + ["-"] * (3 if mode == "rr" else 1)
            cells.append("-")
        elif mode == "rr":
            cells = [
                r["scenario"],
                size,
                _fmt(r["msgs_per_s"]),
                _fmt(r["mb_per_s"], 2),
                _fmt(r["p50_us"]),
                _fmt(r["p99_us"]),
                ratio,
            ]
        else:
            cells = [r["scenario"], size, _fmt(r["msgs_per_s"]), _fmt(r["mb_per_s"], 2), ratio]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _missing(rows: list[dict[str, Any]]) -> list[str]:
    from run import SCENARIOS

    seen = {r["scenario"] for r in rows}
    return [label for label, *_ in SCENARIOS if label not in seen]


def _size(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def _overhead_table(rows: list[dict[str, Any]]) -> list[str]:
    """pyrds.kernel against the stdlib on the same kernel, per cell: time per message, stdlib = 1."""
    out = [
        "| mode | size | stdlib msgs/s | pyrds.kernel msgs/s | pyrds.kernel overhead |",
        "|---|---|---|---|---|",
    ]
    by = {(r["scenario"], r["mode"], r["size"]): r for r in rows if not r.get("error")}
    for mode in ("rr", "oneway"):
        for size in sorted({r["size"] for r in rows}):
            b, k = by.get((BASE, mode, size)), by.get((PYRDS_KERNEL, mode, size))
            if not b or not k or not b.get("msgs_per_s") or not k.get("msgs_per_s"):
                continue
            over = b["msgs_per_s"] / k["msgs_per_s"]
            cells = [mode, _size(size), _fmt(b["msgs_per_s"]), _fmt(k["msgs_per_s"]), f"{over:.2f}x"]
            out.append("| " + " | ".join(cells) + " |")
    return out if len(out) > 2 else []


def _percall_run(run: dict[str, Any] | None) -> list[str]:
    """The per-call table's own date, machine and note when it was measured in a run of its own."""
    if not run:
        return []
    note = f" ({run['note']})" if run.get("note") else ""
    return [f"Measured {run.get('date', '?')} on {run.get('machine', '?')}{note}, in a run of its own.", ""]


def _percall_calls(rows: list[dict[str, Any]]) -> list[str]:
    """Which data calls pyrds.kernel ran (rows before this field was recorded say nothing)."""
    kinds = sorted({str(r["pyrds_kernel_calls"]) for r in rows if "pyrds_kernel_calls" in r})
    if not kinds:
        return []
    what = {"FastCall": "its C data calls (pyrds/kernel/_fastcall.c)", "function": "its Python closures"}
    return [f"pyrds.kernel ran {', '.join(what.get(k, k) for k in kinds)} in this run.", ""]


def _percall_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    names = [k for k, v in rows[0].items() if isinstance(v, dict)]
    head = ["case"] + [f"{n} us" for n in names] + [f"{n} / stdlib" for n in names if n != "stdlib"]
    by_floor = "floor" in names and "pyrds.kernel" in names
    if by_floor:
        head.append("pyrds.kernel / floor")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        base, base_median = r["stdlib"]["best_us"], r["stdlib"]["median_us"]
        cells = [r["case"]]
        cells += [f"{r[n]['best_us']:,.1f} (median {r[n]['median_us']:,.1f})" for n in names]
        cells += [
            f"{r[n]['best_us'] / base:.3f}x (median {r[n]['median_us'] / base_median:.3f}x)"
            for n in names
            if n != "stdlib"
        ]
        if by_floor:
            k, f = r["pyrds.kernel"], r["floor"]
            cells.append(
                f"{k['best_us'] / f['best_us']:.3f}x (median {k['median_us'] / f['median_us']:.3f}x)"
            )
        out.append("| " + " | ".join(cells) + " |")
    return out


def write_report(data: dict[str, Any], md: Path, png: Path, chart: bool = True) -> None:
    """Write the Markdown report of ``data`` to ``md`` and its chart to ``png``; what drew the chart goes into
    ``data["chart"]`` (saved with the results). ``chart`` False (a merged run that did not measure the
    stress rows): ``png`` is left as it is, and the report describes it as its last drawing did."""
    rows: list[dict[str, Any]] = data["results"]
    if chart or "chart" not in data:
        data["chart"] = write_chart(rows, png)
    how = data["chart"]
    lines = [
        "# pyrds benchmarks",
        "",
        f"Measured {data['date']} on {data['machine']}; {data['duration_s']:g} s per cell.",
        "Written by `python benchmarks/run.py` (one guest boot: `python -m vm run`). Every stress,",
        "fan-in, many-sockets and memory path crosses two network namespaces joined by a veth pair inside",
        "the guest: RDS/TCP for the RDS rows, a plain TCP stream (4-byte length framing, TCP_NODELAY) for",
        "the practical limit. The last section is RDS/IB over rdma_rxe (soft-RoCE on a dummy netdev in the",
        "guest's initial namespace): software RDMA under TCG, not an HCA. Clients and servers are",
        "Python (`pyrds stress`, one task), kernel rows measure AF_RDS driven from Python, not rds-stress.",
        "Mixed rows: the userspace node's stack listens on 16386 (the kernel's rds_tcp owns 16385 in every",
        "netns) with an nftables `tcp dport 16385 redirect to :16386` so kernel dials reach it.",
        "CPU % in the raw JSON is the client process only (the userspace stack runs in its own process).",
        "**Baseline:** `kernel<->kernel (stdlib)` is the kernel driven by plain `socket.socket(AF_RDS,",
        "SOCK_SEQPACKET)` objects through the same stress code (benchmarks/stdlib_stress.py); every",
        "`vs stdlib kernel` ratio is msgs/s against that row. `kernel<->kernel (pyrds.kernel)` is",
        "`pyrds stress --backend kernel`.",
        *([f"**Note:** {data['note']}"] if data.get("note") else []),
        *(
            [f"**Not measured in this run:** {', '.join(_missing(rows))} (see the git history of this file)."]
            if rows and _missing(rows)
            else []
        ),
        "",
        "## Request/response (depth 1, reply 0 B)",
        "",
        *_table(rows, "rr"),
        "",
        "## One-way (send as fast as accepted; rate confirmed by the receiver)",
        "",
        *_table(rows, "oneway"),
        "",
        *(
            [
                "## pyrds.kernel overhead (same kernel, same stress code; stdlib = 1.00x time per message)",
                "",
                *_overhead_table(rows),
                "",
            ]
            if _overhead_table(rows)
            else []
        ),
        *(
            [
                "## Per call: pyrds.kernel against the stdlib socket (benchmarks/percall.py)",
                "",
                *_percall_run(data.get("percall_run")),
                "One process, RDS over the loop transport (127.0.0.1 / ::1): µs per iteration of the",
                "loop (one send and one receive; two of each when replying to the source `recvfrom`",
                "returned), the best of the alternating batches (median in brackets). The IPv6 stdlib",
                "socket is an AF_INET6-family `socket.socket` on an AF_RDS fd.",
                "`before` (when present) is another kernel backend loaded from a file (`--percall-before`;",
                "the run's note says which). pyrds.kernel is the tree measured, with its C data calls",
                "(pyrds/kernel/_fastcall.c) when they are built. `floor` is the stdlib socket behind one",
                "do-nothing Python function per data call (`FloorSocket`): the least a pure-Python wrapper",
                "costs, so floor / stdlib is the price of one Python frame per call, what pyrds.kernel pays",
                "without its C module. Target: pyrds.kernel <= 1.05x the stdlib.",
                "",
                *_percall_table(data.get("percall") or []),
                "",
                *_percall_calls(data.get("percall") or []),
            ]
            if data.get("percall")
            else []
        ),
        *_targets_section(data.get("targets")),
        *_fanin_section(data.get("fanin")),
        *_many_section(data.get("many_sockets")),
        *_memory_section(data.get("queued_memory")),
        *_floor_section(data.get("floor")),
        *_ib_section(data.get("ib")),
        f"![chart]({png.name}) - {how}",
        "",
    ]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines))


def write_chart(rows: list[dict[str, Any]], png: Path) -> str:
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    sizes = sorted({r["size"] for r in rows})
    modes = [m for m in ("rr", "oneway") if any(r["mode"] == m for r in rows)]
    if not modes:  # a run of other sections only (--sections percall, ...): the last chart stays as it was
        return "no stress rows in this run, so no chart (benchmarks.png is the last stress run's)"

    def val(s: str, size: int, mode: str) -> float:
        for r in rows:
            if r["scenario"] == s and r["size"] == size and r["mode"] == mode and not r.get("error"):
                return float(r.get("msgs_per_s") or 0.0)
        return 0.0

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _stdlib_chart(png, [[[val(s, z, m) for s in scenarios] for z in sizes] for m in modes])
        return (
            "bars: msgs/s (log scale) per size (left to right 0 B, 1, 8, 64 KiB), rr then one-way; colours "
            "in table order (stdlib PNG, matplotlib not installed)"
        )
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.2), squeeze=False)
    width = 0.8 / max(1, len(scenarios))
    for ax, mode in zip(axes[0], modes, strict=True):
        for i, s in enumerate(scenarios):
            xs = [j + i * width for j in range(len(sizes))]
            ax.bar(
                xs,
                [val(s, z, mode) for z in sizes],
                width,
                label=s,
                color=[c / 255 for c in COLORS[i % len(COLORS)]],
            )
        ax.set_xticks([j + width * (len(scenarios) - 1) / 2 for j in range(len(sizes))])
        ax.set_xticklabels([f"{z // 1024} KiB" if z >= 1024 else f"{z} B" for z in sizes])
        ax.set_yscale("log")
        ax.set_ylabel("messages/s")
        ax.set_title("request/response" if mode == "rr" else "one-way")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return "messages/s, log scale (matplotlib)"


def _stdlib_chart(png: Path, groups: list[list[list[float]]], w: int = 800, h: int = 300) -> None:
    import math

    pix = bytearray(b"\xff" * (w * h * 3))
    allv = [v for m in groups for z in m for v in z if v > 0]
    top = math.log10(max(allv)) if allv else 1.0
    cols = sum(len(z) + 1 for m in groups for z in m) + len(groups)
    bw = max(1, w // max(1, cols))
    x = bw
    for m in groups:
        for z in m:
            for i, v in enumerate(z):
                bar = int((math.log10(v) / top) * (h - 10)) if v > 1 else 0
                for xx in range(x, min(w, x + bw - 1)):
                    for yy in range(h - bar, h):
                        o = (yy * w + xx) * 3
                        pix[o : o + 3] = bytes(COLORS[i % len(COLORS)])
                x += bw
            x += bw
        x += bw
    raw = b"".join(b"\x00" + bytes(pix[r * w * 3 : (r + 1) * w * 3]) for r in range(h))

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    png.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


# ------------------------------------------------------------------ fan-in, many sockets, queued memory
# (newer sections: a results file without them renders the tables above unchanged plus a "not measured" line)


def _not_measured(what: str, section: str) -> list[str]:
    return [
        f"Not measured: this results file has no {what} (measure them with `python benchmarks/run.py "
        f"--sections {section} --merge`, or `--guest --sections {section}` inside a guest).",
        "",
    ]


def _measured_line(sec: dict[str, Any]) -> list[str]:
    line = f"Measured {sec.get('date', '?')} on {sec.get('machine', '?')}."
    return [line, *([f"**Note:** {sec['note']}"] if sec.get("note") else []), ""]


def _failed(r: dict[str, Any], width: int) -> list[str]:
    return [f"failed: {r['error']}"] + ["-"] * width


def _ratio(v: Any, base: Any) -> str:
    return f"{v / base:.2f}x" if v and base else "-"


def _fanin_section(sec: dict[str, Any] | None) -> list[str]:
    out = ["## Fan-in: senders in separate processes -> 1 receiver (one-way, 1 KiB)", ""]
    if not sec:
        return out + _not_measured("fan-in rows", "fanin")
    out += _measured_line(sec)
    out += [
        f"{sec.get('senders', '?')} sender processes in node A, one socket each, send 1 KiB messages one-way "
        f"for {sec.get('seconds', '?')} s",
        "to one socket in node B, whose process only reads and counts. The senders start together (one",
        '"go" line once every socket is bound); a send that finds no space waits for it, as in',
        "`pyrds stress --one-way`. **msgs/s** is what the receiver got, divided by the time from its first",
        "to its last message; `vs stdlib kernel` is that rate against the `kernel<->kernel (stdlib)` fan-in",
        "row. `sent` counts successful send calls; the senders keep their sockets open until the receiver",
        "has been idle for 1 s, so sent = received unless messages were lost.",
        "",
        "| path | senders | sent | received | msgs/s received | MB/s | vs stdlib kernel |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = sec.get("rows") or []
    base = next((r.get("msgs_per_s") for r in rows if r["scenario"] == BASE and not r.get("error")), None)
    for r in rows:
        cells = [r["scenario"], str(r.get("senders", sec.get("senders", "-")))]
        if r.get("error") and not r.get("msgs_per_s"):
            cells += _failed(r, 4)
        else:
            cells += [
                _fmt(r.get("sent")),
                _fmt(r.get("received")),
                _fmt(r.get("msgs_per_s")),
                _fmt(r.get("mb_per_s"), 2),
                _ratio(r.get("msgs_per_s"), base),
            ]
            if r.get("error"):
                cells[-1] += f" (error: {r['error']})"
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def best_rates(rows: Any) -> dict[tuple[str, int], dict[str, float]]:
    """Floor rows (benchmarks/floor.py): (mode, size) -> kind -> the best rate of its repeats (the one least
    disturbed by the machine)."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        cell = out.setdefault((r["mode"], r["size"]), {})
        cell[r["kind"]] = max(cell.get(r["kind"], 0.0), r.get("msgs_per_s") or 0.0)
    return out


def _floor_section(sec: dict[str, Any] | None) -> list[str]:
    out = ["## Floor: what the process structure costs before any RDS work (benchmarks/floor.py)", ""]
    if not sec:
        return out + _not_measured("floor rows", "floor")
    out += _measured_line(sec)
    out += [
        "The userspace stack is one service per network namespace: every message goes client -> service ->",
        "TCP -> service -> client, two process hops per direction that the kernel does inside the sender's",
        "and the receiver's system calls. Here every row is the least Python can do, in one namespace pair",
        "of its own: blocking calls, no poll, no checks. `kernel` is AF_RDS over RDS/TCP (stdlib sockets);",
        "`relay` is the same loop over an AF_UNIX SOCK_SEQPACKET to a minimal relay process per namespace,",
        "the two relays joined by one TCP connection (a 4-byte length per message): the userspace stack's",
        "process structure with none of its work (no RDS header, sequence, ack, accounting, readiness fd);",
        '`userspace` is the same loop on `pyrds.socket("userspace")`. relay / kernel is the ceiling of any',
        "stack built this way in Python on this machine; userspace / relay is how much of it pyrds keeps."
        " Best of "
        f"{sec.get('repeat', '?')} alternating runs of {sec.get('seconds', '?'):g} s per cell.",
        "Receivers here read whole messages; the stress tables' one-way receivers (`pyrds stress",
        "--passive`) read at most 4 KiB of each, which spares every row there the copy of a large message.",
    ]
    rows = sec.get("rows") or []
    compiled = any(r["kind"] == "relay-c" for r in rows)
    if compiled:
        out += [
            "`relay-c` is the same relay compiled from benchmarks/relay.c (same wire, same flow control):",
            "the structure with its two middle processes free of the interpreter, where a service in C would",
            "start from.",
        ]
    kinds = ["kernel", "relay", *(["relay-c"] if compiled else []), "userspace"]
    ratios = [("relay", "kernel"), *([("relay-c", "kernel")] if compiled else []), ("userspace", "kernel")]
    ratios += [("userspace", "relay"), *([("userspace", "relay-c")] if compiled else [])]
    head = [f"{k} msgs/s" for k in kinds] + [f"{x} / {y}" for x, y in ratios]
    out += ["", "| cell | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for (mode, size), rates in best_rates(rows).items():
        name = ("request/response" if mode == "rr" else "one-way") + f" {_size(size)}"
        cells = [name, *(_fmt(rates.get(k)) for k in kinds)]
        cells += [_ratio(rates.get(x), rates.get(y)) for x, y in ratios]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _many_section(sec: dict[str, Any] | None) -> list[str]:
    out = ["## Many sockets in one process (one-way, 1 KiB, round-robin)", ""]
    if not sec:
        return out + _not_measured("many-sockets rows", "many")
    out += _measured_line(sec)
    out += [
        "One process in node A opens N RDS sockets, binds each to node A's address with port 0 (the",
        "`ports` column counts the distinct ports bind chose), then sends 1 KiB messages one-way for "
        f"{sec.get('seconds', '?')} s,",
        "one socket after the other (a socket without send space is waited for), to one receiving socket",
        "in node B. **open+bind** is the wall time of the N `socket()` + `bind()` calls (before them one",
        "socket is opened and closed untimed, so a userspace stack service that had idled out starts",
        "outside the timing); for userspace every socket is a control connection to the namespace's stack",
        "service, so this is the service's per-socket cost as the application sees it. **msgs/s** is the",
        "receiver's rate (first to last message), `vs stdlib kernel` against the stdlib kernel row of the",
        f"same N. Soft RLIMIT_NOFILE of the benchmark processes in the guest: {sec.get('nofile', '?')}.",
        "",
        "| path | sockets | ports | open+bind s | per socket ms | msgs/s received | vs stdlib kernel |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = sec.get("rows") or []
    base = {r["sockets"]: r.get("msgs_per_s") for r in rows if r["scenario"] == BASE and not r.get("error")}
    order = {s: i for i, s in enumerate(dict.fromkeys(r["scenario"] for r in rows))}
    for r in sorted(rows, key=lambda r: (order[r["scenario"]], r["sockets"])):
        cells = [r["scenario"], str(r["sockets"])]
        if r.get("error") and not r.get("msgs_per_s"):
            cells += _failed(r, 4)
        else:
            ob = r.get("open_bind_s")
            cells += [
                _fmt(r.get("distinct_ports")),
                _fmt(ob, 3),
                _fmt(ob * 1000 / r["sockets"] if ob is not None and r["sockets"] else None, 2),
                _fmt(r.get("msgs_per_s")),
                _ratio(r.get("msgs_per_s"), base.get(r["sockets"])),
            ]
            if r.get("error"):
                cells[-1] += f" (error: {r['error']})"
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _per_msg(kb: Any, n: Any) -> str:
    """kB growth as bytes per message."""
    if kb is None or not n:
        return "-"
    return f"{kb * 1024 / n:,.0f}"


def _memory_section(sec: dict[str, Any] | None) -> list[str]:
    out = ["## Memory per queued message (receiver does not read; 1 KiB)", ""]
    if not sec:
        return out + _not_measured("queued-memory rows", "mem")
    limit = sec.get("limit", "?")
    sockbuf = sec.get("sockbuf")
    out += _measured_line(sec)
    out += [
        "A fresh node pair per row. After 20 warm-up messages (sent and read, so the RDS connection",
        "exists), the sender sends 1 KiB messages without waiting until the first EAGAIN or ENOBUFS, or",
        f"{limit} messages; the receiving socket (SO_RCVBUF "
        f"{_fmt(sockbuf / 1048576 if sockbuf else None)} MiB, like the sender's SO_SNDBUF) is not read.",
        "Once its receive queue holds what was sent (or stood still for 3 s) the memory is read, then the",
        "queue is read back. Columns:",
        "",
        "- **sent (stop)**: successful sends, and why sending stopped (`limit`: none failed).",
        "- **queued**: messages in the receiving socket's queue at the measurement, from",
        "  RDS_INFO_RECV_MESSAGES (the records of its address and port; kernel: read through another AF_RDS",
        "  socket in the receiver's netns, userspace: the stack's table); **read back**: messages the",
        "  receiver then read.",
        "- **accounted B/msg**: growth of `recv_bytes_added_to_sock - recv_bytes_freed_fromsock`",
        "  (RDS_INFO_COUNTERS) per queued message: the payload bytes charged against the socket's receive",
        "  buffer. Both stacks charge the payload length only, so this is 1024 by construction: it checks",
        "  the count, it is not a memory cost. The kernel's counters are the module's global per-CPU sums",
        "  (not per netns); the userspace stack's are that node's.",
        "- **service RSS B/msg** (userspace): growth of VmRSS (/proc/PID/status) of the receiving node's",
        "  stack service (the one process whose cmdline has `pyrds.userspace.service` in that netns) per",
        "  queued message: what the queue costs in the process that holds it. RSS counts pages touched, so",
        "  free heap left from earlier work hides growth (hence the fresh pair: a new service that has only",
        "  seen the 20 warm-up messages).",
        "- **MemFree drop B/msg**: fall of MemFree (/proc/meminfo, the whole guest) per queued message;",
        "  for the kernel this is the real cost of the queue (message structures, skbs or pages), for",
        "  userspace it adds the kernel side (TCP buffers, page tables) to the RSS growth. Machine-wide, so",
        "  anything else running moves it: **idle** is its change over 1 s before sending (same unit).",
        "- **Slab growth B/msg**: growth of Slab (/proc/meminfo) per queued message, part of the MemFree",
        "  drop.",
        "- **after read-back**: RSS growth (userspace) and MemFree drop in kB against the baseline, after",
        "  the queue was read: what was not given back.",
        "",
        "| path | receiver | sent (stop) | queued | read back | accounted B/msg | service RSS B/msg "
        "| MemFree drop B/msg (idle) | Slab growth B/msg | after read-back kB (RSS / MemFree) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sec.get("rows") or []:
        cells = [r["scenario"], str(r.get("receiver", "-"))]
        if r.get("error") and not r.get("queued"):
            cells += _failed(r, 7)
        else:
            n = r.get("queued")
            idle = _per_msg(r.get("idle_memfree_drop_kb"), n)
            rss_after = _fmt(r.get("rss_after_drain_kb"))
            cells += [
                f"{_fmt(r.get('sent'))} ({r.get('stop', '-')})",
                _fmt(n),
                _fmt(r.get("drained")),
                f"{r['accounted_bytes'] / n:,.0f}" if r.get("accounted_bytes") is not None and n else "-",
                _per_msg(r.get("rss_growth_kb"), n),
                f"{_per_msg(r.get('memfree_drop_kb'), n)} ({idle})",
                _per_msg(r.get("slab_growth_kb"), n),
                f"{rss_after} / {_fmt(r.get('memfree_drop_after_drain_kb'))}",
            ]
            if r.get("error"):
                cells[-1] += f" (error: {r['error']})"
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


# ------------------------------------------------------------------------------------------------ RDS/IB


def _ib_missing(sec: dict[str, Any]) -> list[str]:
    from ib_section import IB_SCENARIOS, PEER_SCENARIOS

    seen = {r["scenario"] for r in sec.get("rows") or []}
    # a peer guest's scenario has its own line (_ib_two_guests)
    return [label for label, *_ in IB_SCENARIOS if label not in seen and label not in PEER_SCENARIOS]


def _ib_two_guests(sec: dict[str, Any], where: str) -> list[str]:
    """What the report says of kernel->userspace: measured across two guests, or why not."""
    label = "kernel->userspace"
    if any(r["scenario"] == label for r in sec.get("rows") or []):
        return [
            f"- `{label}` ({where}): on one machine the kernel would dial port 18634 of the other",
            "  address and reach its own rds_rdma, so this row crosses two guests: this guest's kernel",
            "  (pyrds.kernel, as the RDS/TCP row) on its link address, over the link's rxe device, to the",
            "  userspace stack of a second, 1-vCPU guest (`vm run --peer-ib`, vm/ib_peer.py), whose passive",
            "  side is the same serving loop run by that guest's peer agent",
            "  (`pyrds.testing.workloads.stress_passive`). The link",
            "  between two TCG guests is not the dummy netdev of the other rows: compare this row with",
            "  the others as a different path, not as a ratio of one path.",
        ]
    why = (sec.get("unavailable") or {}).get(label) or "not in this run"
    return [
        f"- `kernel->userspace` is not measured ({why}): on one machine the kernel would dial port 18634",
        "  of the other address and reach its own rds_rdma; it needs two guests.",
    ]


def _ib_section(sec: dict[str, Any] | None) -> list[str]:
    out = ["## RDS/IB over rdma_rxe (soft-RoCE on a dummy netdev, TCG guest)", ""]
    if not sec:
        return out + _not_measured("RDS/IB rows", "ib")
    out += _measured_line(sec)
    fabric = sec.get("fabric") or {}
    pairs = sec.get("pairs") or {}

    def where(pairing: str) -> str:
        p = pairs.get(pairing) or {}
        return f"{p['a']} -> {p['b']}" if p.get("a") else "-"

    out += [
        "**These are rxe figures.** RDS over rdma_rxe, the kernel's software RoCE, on a dummy netdev",
        "inside the same TCG guest: every RDMA operation is CPU work (emulated by TCG), so the rows compare",
        "the paths with each other and say nothing about RDS/IB on an HCA. RDS/IB lives in the initial",
        "network namespace only (the kernel's rds_rdma and the userspace stack alike), so the two nodes of",
        "each pairing are two IPv4 addresses of one dummy netdev carrying one rxe device, built by",
        "`pyrds.testing.ib` as in the conformance IB phase"
        + (f" ({fabric['rxe']} on {fabric['netdev']}, {fabric['subnet']})" if fabric else "")
        + ".",
        f"Same stress code, cell length ({sec.get('duration_s', '?')} s) and buffers as the RDS/TCP rows "
        "above, every",
        "socket of both sides pinned with `SO_RDS_TRANSPORT=IB` before bind (`pyrds stress --transport",
        "ib`); the RDS/TCP rows cross a veth pair between two namespaces instead, so the two tables are",
        "not the same path. `vs stdlib kernel` is msgs/s against this section's `kernel<->kernel (stdlib)`",
        f"row. One cell is one {sec.get('duration_s', '?')} s run: on a loaded host (see the note) single "
        "cells swing",
        "widely (the p99 column shows it), so read a difference between rows from several sizes, not from",
        "one cell.",
        "",
        f"- `userspace<->userspace` ({where('userspace-userspace')}) ran first, with the kernel's",
        "  rds_rdma unloaded (both userspace stacks listen on rdma_cm port 18634, which rds_rdma otherwise",
        "  holds), before the kernel had any RDS/IB connection: unloading rds_rdma after kernel RDS/IB",
        "  connections panicked 7.3.4. rds_rdma was loaded again afterwards.",
        f"- Then `kernel<->kernel` ({where('kernel-kernel')}; stdlib sockets and pyrds.kernel over one",
        f"  kernel connection) and `userspace->kernel` ({where('userspace-kernel')}), alternating cell",
        "  by cell. In `userspace->kernel` the userspace node is active-only (the kernel's rds_rdma holds",
        "  port 18634) and dials the kernel, which answers on that connection.",
        *_ib_two_guests(sec, where("kernel-userspace")),
    ]
    if sec.get("kernel_ib_connections") is not None:
        out.append(
            f"- RDS/IB connections the kernel listed at the end: {sec['kernel_ib_connections']} "
            "(RDS6_INFO_IB_CONNECTIONS)."
        )
    if sec.get("error"):
        out.append(f"- **Section error:** {sec['error']}")
    missing = _ib_missing(sec)
    if missing:
        out.append(f"- **Not measured in this run:** {', '.join(missing)}.")
    rows: list[dict[str, Any]] = sec.get("rows") or []
    out.append("")
    if any(r["mode"] == "rr" for r in rows):
        out += ["### RDS/IB request/response (depth 1, reply 0 B)", "", *_table(rows, "rr"), ""]
    if any(r["mode"] == "oneway" for r in rows):
        out += ["### RDS/IB one-way (rate confirmed by the receiver)", "", *_table(rows, "oneway"), ""]
    return out


#: issue 10's userspace targets: (mode, size) -> the least userspace<->userspace / stdlib kernel ratio
TARGETS = {("rr", 1024): 0.25, ("oneway", 65536): 0.5}
UU = "userspace<->userspace"
MIXED = ("userspace->kernel", "kernel->userspace")


def target_verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every (mode, size) of ``rows`` (targets section: each row has a ``rep``), each scenario's ratio to
    the stdlib kernel row *of the same repetition* (one interleaved pass), and the median of those ratios
    over the repetitions with both rates. A verdict per cell: userspace<->userspace against its target
    (:data:`TARGETS`), each mixed pairing against the userspace<->userspace median of the cell (issue 10:
    mixed pairings >= the userspace<->userspace ratio); ``met`` is None where there is nothing to judge."""
    cells: dict[tuple[str, int], dict[str, dict[int, float]]] = {}
    for r in rows:
        if r.get("error") or not r.get("msgs_per_s"):
            continue
        cells.setdefault((r["mode"], r["size"]), {}).setdefault(r["scenario"], {})[r["rep"]] = r["msgs_per_s"]
    out: list[dict[str, Any]] = []
    for (mode, size), by in cells.items():
        base = by.get(BASE, {})
        ratios_of = {
            scenario: [rate / base[rep] for rep, rate in sorted(reps.items()) if base.get(rep)]
            for scenario, reps in by.items()
        }
        uu = _median(ratios_of.get(UU, []))
        for scenario, reps in by.items():
            if scenario == BASE:
                continue
            med = _median(ratios_of[scenario])
            target: float | None = None
            if scenario == UU:
                target = TARGETS.get((mode, size))
            elif scenario in MIXED:
                target = uu
            met = None if target is None or med is None else med >= target
            out.append(
                {
                    "mode": mode,
                    "size": size,
                    "scenario": scenario,
                    "rates": [reps[k] for k in sorted(reps)],
                    "ratios": ratios_of[scenario],
                    "median": med,
                    "target": target,
                    "met": met,
                }
            )
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _targets_section(sec: dict[str, Any] | None) -> list[str]:
    out = ["## Issue 10 targets, measured again and again (interleaved repetitions)", ""]
    if not sec:
        return out + _not_measured("target rows", "targets")
    out += _measured_line(sec)
    out += [
        f"The target cells only: {sec.get('repeat', '?')} passes of {sec.get('seconds', '?'):g} s per cell,"
        " each pass running every scenario",
        "once per cell in turn (as the stress tables do), so a ratio compares two rates measured",
        "a few seconds apart. **ratios** are each pass's msgs/s against the same pass's stdlib kernel row;",
        "the verdict uses their **median**. Targets: userspace<->userspace >= 0.25x at request/response",
        "1 KiB and >= 0.5x one-way 64 KiB; each mixed pairing >= the userspace<->userspace median of the",
        "same cell.",
        "",
        "| cell | path | msgs/s per pass | ratios per pass | median | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = sec.get("rows") or []
    base_rates: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r["scenario"] == BASE and r.get("msgs_per_s"):
            base_rates.setdefault((r["mode"], r["size"]), []).append(r["msgs_per_s"])
    verdicts = target_verdicts(rows)
    # every cell with a rate, also one whose stdlib row failed in every pass (its ratios are then empty)
    for mode, size in sorted({(v["mode"], v["size"]) for v in verdicts} | set(base_rates)):
        name = ("request/response" if mode == "rr" else "one-way") + f" {_size(size)}"
        rates = base_rates.get((mode, size), [])
        out.append(f"| {name} | {BASE} | {', '.join(_fmt(x) for x in rates) or '-'} | 1.00x | - | - | - |")
        for v in verdicts:
            if (v["mode"], v["size"]) != (mode, size):
                continue
            med = v["median"]
            target = "-" if v["target"] is None else f">= {v['target']:.2f}x"
            met = "-" if v["met"] is None else ("yes" if v["met"] else "**no**")
            out.append(
                f"| {name} | {v['scenario']} | {', '.join(_fmt(x) for x in v['rates'])} | "
                f"{', '.join(f'{x:.2f}x' for x in v['ratios'])} | "
                f"{'-' if med is None else f'{med:.2f}x'} | {target} | {met} |"
            )
    failed = [r for r in rows if r.get("error")]
    if failed:
        out += ["", f"Failed cells: {len(failed)} ({'; '.join(sorted({str(r['error']) for r in failed}))})."]
    return out + [""]
