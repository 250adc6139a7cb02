"""``pyrds stress``: RDS throughput and latency like rds-stress.

Active side: ``pyrds stress -s LOCAL -r PEER [-p PORT] [-q SIZE] [-d DEPTH] [-t TASKS] [-T SECONDS]``.
Passive side: ``pyrds stress --passive -s LOCAL [-p PORT]`` (or any invocation without ``-r``).
``--transport tcp|ib`` pins every socket of either side (SO_RDS_TRANSPORT, before bind); RDS/IB needs an
address of an RDMA device in the initial network namespace.
Request/response (default): each task keeps DEPTH requests outstanding, the passive side answers each with
an ACK-SIZE reply, the rtt column is request-to-reply. ``--one-way``: tasks send as fast as the socket accepts
and the passive side only counts; the final rate is what the passive side confirmed it received.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from pyrds.api import RDSSocketBase
from pyrds.cli.common import (
    UserError,
    add_backend_option,
    add_transport_option,
    describe_oserror,
    open_socket,
    parse_ip,
    pin_transport,
    positive_float,
    positive_int,
    size_arg,
    sockaddr,
)
from pyrds.cli.stress_proto import (
    SendWaits,
    Stopped,
    StressError,
    control,
    parse_control,
    recv_wait,
    send_retry,
    serve,
    size_buffers,
)

DEFAULT_PORT = 4000
REPLY_TIMEOUT = 10.0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stress", help="RDS throughput/latency test (active and passive sides)")
    p.add_argument(
        "-s", "--send-addr", dest="local", default=None, help="local address to bind (default 127.0.0.1)"
    )
    p.add_argument(
        "-r",
        "--recv-addr",
        dest="peer",
        default=None,
        help="peer address running the passive side; without it this side is passive",
    )
    p.add_argument(
        "-p", "--port", type=int, default=DEFAULT_PORT, help=f"passive side's port ({DEFAULT_PORT})"
    )
    p.add_argument("-q", "--size", type=size_arg, default=1024, help="message size in bytes (K/M ok; 1024)")
    p.add_argument("-a", "--ack-size", type=size_arg, default=0, help="rr reply size in bytes (0)")
    p.add_argument("-d", "--depth", type=positive_int, default=1, help="outstanding requests per task (1)")
    p.add_argument("-t", "--tasks", type=positive_int, default=1, help="concurrent tasks (threads, 1)")
    p.add_argument("-T", "--duration", type=duration_arg, default=10.0, help="seconds to run (> 0; 10)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--one-way", dest="mode", action="store_const", const="oneway", help="send only")
    mode.add_argument(
        "--rr", dest="mode", action="store_const", const="rr", help="request/response (default)"
    )
    p.add_argument(
        "--sockbuf",
        type=size_arg,
        default=None,
        help="SO_SNDBUF/SO_RCVBUF bytes (default max(4M, 8*size*depth); 0 keeps the system default)",
    )
    p.add_argument(
        "-W",
        "--timeout",
        type=positive_float,
        default=REPLY_TIMEOUT,
        help=f"seconds to wait for the passive side / a reply ({REPLY_TIMEOUT:g})",
    )
    p.add_argument("--passive", action="store_true", help="act as the passive (server) side")
    p.add_argument("--once", action="store_true", help="passive: exit after the first run finishes")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON on stdout")
    p.add_argument("--no-rows", action="store_true", help="no per-second rows, summary only")
    add_backend_option(p)
    add_transport_option(p)
    p.set_defaults(func=run, mode="rr")


def duration_arg(text: str) -> float:
    """-T: a run of 0 s measures nothing, so it is a usage error rather than an empty summary."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0: {text!r}")
    return value


@dataclass
class TaskStats:
    sent: int = 0
    replies: int = 0
    rtt_sum: float = 0.0
    rtts: list[float] = field(default_factory=list)
    confirmed: int | None = None
    error: str | None = None
    waits: SendWaits = field(default_factory=SendWaits)


@dataclass
class Summary:
    backend: str
    mode: str
    size: int
    ack_size: int
    depth: int
    tasks: int
    local: str
    peer: str
    port: int
    seconds: float
    messages: int
    msgs_per_s: float
    mb_per_s: float
    rtt_us: dict[str, float] | None
    cpu_pct: float
    errors: list[str]
    transport: str | None = None  # --transport (None: unpinned)
    #: refusals the senders waited out: {"eagain": n, "enobufs": n, "slept_s": seconds backing off}
    send_waits: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def text(self) -> str:
        lines = [
            f"--- pyrds stress summary ({self.backend} backend, {self.mode}{_pinned(self.transport)}) ---",
            f"{self.local} -> {self.peer}:{self.port}  size {self.size} B  "
            f"depth {self.depth}  tasks {self.tasks}",
            f"{self.messages} msgs in {self.seconds:.2f} s: {self.msgs_per_s:.0f} msgs/s, "
            f"{self.mb_per_s:.2f} MB/s, cpu {self.cpu_pct:.0f}%",
        ]
        if self.rtt_us:
            r = self.rtt_us
            lines.append(
                f"rtt usec: min {r['min']:.0f}  avg {r['avg']:.0f}  p50 {r['p50']:.0f}  "
                f"p99 {r['p99']:.0f}  max {r['max']:.0f}"
            )
        lines.extend(f"error: {e}" for e in self.errors)
        return "\n".join(lines)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    idx = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[idx]


def sockbuf_bytes(args: argparse.Namespace) -> int:
    if args.sockbuf is not None:
        return int(args.sockbuf)
    return max(4 << 20, 8 * max(int(args.size), 1024) * int(args.depth))


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Task(threading.Thread):
    def __init__(
        self,
        args: argparse.Namespace,
        local: str,
        peer: str,
        stop: threading.Event,
        start_gate: threading.Barrier,
    ) -> None:
        super().__init__(daemon=True)
        self.args = args
        self.local = local
        self.dest = sockaddr(peer, args.port)
        self.stop = stop
        self.gate = start_gate
        self.stats = TaskStats()
        self.sock: RDSSocketBase | None = None
        self.backend = ""

    def setup(self) -> None:
        """Socket, bind and hello handshake (runs in the main thread so errors surface early)."""
        sock = open_socket(self.args.backend)
        self.sock, self.backend = sock, sock.backend
        pin_transport(sock, self.args.transport)
        try:
            sock.bind(sockaddr(self.local, 0))
        except OSError as exc:
            raise UserError(f"cannot bind to {self.local}: {_bind_error(exc, self.args)}", 2) from None
        if sockbuf_bytes(self.args):
            size_buffers(sock, sockbuf_bytes(self.args))
        sock.setblocking(False)
        hello = control("hello", mode=self.args.mode, ack=self.args.ack_size, size=self.args.size)
        end = time.monotonic() + self.args.timeout
        while time.monotonic() < end:
            # resend the hello every second: a message to a port nobody has bound yet is dropped
            try:
                send_retry(sock, hello, self.dest, end, self.stop)
            except OSError as exc:
                where = f"{self.dest[0]}:{self.dest[1]}"
                raise UserError(f"cannot send to {where}: {describe_oserror(exc)}", 1) from None
            except StressError:
                break
            got = recv_wait(sock, min(1.0, max(0.0, end - time.monotonic())))
            ctl = parse_control(got[0]) if got else None
            if ctl and ctl.get("op") == "ready":
                self._drain_ready(sock)
                return
        raise UserError(
            f"no stress server answered at {self.dest[0]}:{self.dest[1]} within "
            f"{self.args.timeout:g} s (start one with: pyrds stress --passive -s {self.dest[0]} "
            f"-p {self.dest[1]})",
            1,
        )

    def _drain_ready(self, sock: RDSSocketBase) -> None:
        """Swallow duplicate 'ready' answers to resent hellos (they arrive right away, in order)."""
        while True:
            got = recv_wait(sock, 0.05)
            if got is None:
                return
            ctl = parse_control(got[0])
            if not ctl or ctl.get("op") != "ready":
                return

    def run(self) -> None:
        assert self.sock is not None
        try:
            self.gate.wait()
            if self.args.mode == "rr":
                self._rr(self.sock)
            else:
                self._oneway(self.sock)
            self._finish(self.sock)
        except (OSError, StressError) as exc:
            msg = describe_oserror(exc) if isinstance(exc, OSError) else str(exc)
            self.stats.error = msg
            self.stop.set()

    def _rr(self, sock: RDSSocketBase) -> None:
        payload = bytes(self.args.size)
        depth = self.args.depth
        st = self.stats
        sent_at: deque[float] = deque()
        mono = time.monotonic
        while not self.stop.is_set():
            try:
                while len(sent_at) < depth:
                    send_retry(sock, payload, self.dest, mono() + self.args.timeout, self.stop, st.waits)
                    sent_at.append(mono())
                    st.sent += 1
            except Stopped:
                break
            self._take_reply(sock, sent_at)
        while sent_at:  # drain what is still outstanding
            self._take_reply(sock, sent_at)

    def _take_reply(self, sock: RDSSocketBase, sent_at: deque[float]) -> None:
        got = recv_wait(sock, self.args.timeout, self.args.ack_size + 4096)
        if got is None:
            raise StressError(f"no reply from {self.dest[0]}:{self.dest[1]} for {self.args.timeout:g} s")
        if got[0].startswith(b"\xfe"):
            return
        rtt = (time.monotonic() - sent_at.popleft()) * 1e6
        st = self.stats
        st.replies += 1
        st.rtt_sum += rtt
        st.rtts.append(rtt)

    def _oneway(self, sock: RDSSocketBase) -> None:
        payload = bytes(self.args.size)
        st = self.stats
        mono = time.monotonic
        while not self.stop.is_set():
            try:
                send_retry(sock, payload, self.dest, mono() + self.args.timeout, self.stop, st.waits)
            except Stopped:
                return
            st.sent += 1

    def _finish(self, sock: RDSSocketBase) -> None:
        send_retry(
            sock, control("fin"), self.dest, time.monotonic() + self.args.timeout * 3, threading.Event()
        )
        end = time.monotonic() + self.args.timeout * 3
        while time.monotonic() < end:
            got = recv_wait(sock, end - time.monotonic())
            if got is None:
                break
            ctl = parse_control(got[0])
            if ctl and ctl.get("op") == "done":
                self.stats.confirmed = int(ctl.get("received", 0))
                return
        raise StressError("the passive side did not confirm the end of the run")


class Reporter:
    """Per-second rows: a carriage-return progress line on a TTY, plain lines otherwise."""

    HEADER = f"{'sec':>5} {'tx/s':>9} {'MB/s':>9} {'rtt us':>9} {'cpu %':>6}"

    def __init__(self, out: TextIO, size: int, enabled: bool) -> None:
        self.out = out
        self.size = size
        self.enabled = enabled
        self.tty = out.isatty()
        self.printed_header = False

    def row(self, sec: float, tx: float, rtt_us: float | None, cpu: float) -> None:
        if not self.enabled:
            return
        if not self.printed_header and not self.tty:
            print(self.HEADER, file=self.out)
            self.printed_header = True
        rtt = f"{rtt_us:9.0f}" if rtt_us is not None else f"{'-':>9}"
        line = f"{sec:5.1f} {tx:9.0f} {tx * self.size / 1e6:9.2f} {rtt} {cpu:6.0f}"
        if self.tty:
            self.out.write(f"\r{self.HEADER.strip()} | {line.strip()}   ")
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.out.write("\n")
            self.out.flush()


def run(args: argparse.Namespace) -> int:
    if args.ack_size and args.mode != "rr":
        raise UserError("-a/--ack-size only applies to request/response (--rr)")
    if args.size > (1 << 20):
        raise UserError("message size above 1 MiB (RDS_MAX_MSG_SIZE)")
    if not 1 <= args.port <= 0xFFFF:
        raise UserError("port must be 1-65535")
    local = parse_ip(args.local, "local address") if args.local else "127.0.0.1"
    if args.passive or args.peer is None:
        return _passive(args, local)
    peer = parse_ip(args.peer, "peer address")
    return _active(args, local, peer)


def _pinned(transport: str | None) -> str:
    """``", pinned to IB"`` for the summary and the passive side's line ("" when unpinned)."""
    return f", pinned to {transport.upper()}" if transport else ""


def _bind_error(exc: OSError, args: argparse.Namespace) -> str:
    why = describe_oserror(exc)
    if args.transport == "ib":
        why += (
            " (a socket pinned to RDS/IB binds an address of an RDMA device; the userspace stack: not IPv6"
            " link-local)"
        )
    return why


def _passive(args: argparse.Namespace, local: str) -> int:
    sock = open_socket(args.backend)
    try:
        pin_transport(sock, args.transport)
        try:
            sock.bind(sockaddr(local, args.port))
        except OSError as exc:
            raise UserError(f"cannot bind to {local}:{args.port}: {_bind_error(exc, args)}", 2) from None
        if sockbuf_bytes(args):
            size_buffers(sock, sockbuf_bytes(args))
        # the listening line tells scripts (benchmarks, tests) that the port is bound
        print(
            f"pyrds stress passive on {local}:{args.port} ({sock.backend} backend{_pinned(args.transport)})",
            file=sys.stderr if args.json else sys.stdout,
            flush=True,
        )
        return serve(sock, args.once, args.json)
    finally:
        sock.close()


def _active(args: argparse.Namespace, local: str, peer: str) -> int:
    stop = threading.Event()
    gate = threading.Barrier(args.tasks + 1)
    tasks = [Task(args, local, peer, stop, gate) for _ in range(args.tasks)]
    rows_out = sys.stderr if args.json else sys.stdout
    reporter = Reporter(rows_out, args.size, not args.no_rows)
    cpu0, t0 = cpu_seconds(), time.monotonic()
    # the summary's cpu % covers the same span as the per-second rows: from the start gate until the run
    # is stopped (end of -T or Ctrl-C), not the drain and the end-of-run handshake after it
    cpu_span: float | None = None

    def run_cpu() -> float:
        return (cpu_seconds() - cpu0) / max(time.monotonic() - t0, 1e-9) * 100.0

    try:
        for t in tasks:
            t.setup()
            t.start()
        cpu0, t0 = cpu_seconds(), time.monotonic()
        gate.wait()
        _sample_loop(args, tasks, stop, reporter, t0, cpu0)
        cpu_span = run_cpu()
        stop.set()
        for t in tasks:
            t.join(args.timeout * 4)
        elapsed = time.monotonic() - t0
    except KeyboardInterrupt:
        if cpu_span is None:
            cpu_span = run_cpu()
        stop.set()
        for t in tasks:
            t.join(REPLY_TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        reporter.close()
        for t in tasks:
            if t.sock is not None and not t.is_alive():
                t.sock.close()
    cpu = cpu_span if cpu_span is not None else 0.0
    summary = _summarize(args, tasks, local, peer, elapsed, cpu)
    if args.json:
        print(json.dumps(summary.as_dict()), flush=True)
    else:
        print(summary.text(), flush=True)
    return 0 if summary.messages > 0 and not summary.errors else 1


def _sample_loop(
    args: argparse.Namespace,
    tasks: list[Task],
    stop: threading.Event,
    reporter: Reporter,
    t0: float,
    cpu0: float,
) -> None:
    end = t0 + args.duration
    last_t, last_cpu = t0, cpu0
    last_sent, last_rtt_sum, last_replies = 0, 0.0, 0
    while not stop.is_set():
        now = time.monotonic()
        if now >= end:
            return
        stop.wait(min(1.0, end - now, max(0.0, last_t + 1.0 - now)))
        now = time.monotonic()
        if stop.is_set():
            return
        if now - last_t < 0.999 and now < end:
            continue
        sent = sum(t.stats.sent for t in tasks)
        replies = sum(t.stats.replies for t in tasks)
        rtt_sum = sum(t.stats.rtt_sum for t in tasks)
        cpu = cpu_seconds()
        dt = max(now - last_t, 1e-9)
        d_rep = replies - last_replies
        rtt = (rtt_sum - last_rtt_sum) / d_rep if d_rep else None
        reporter.row(
            now - t0,
            (sent - last_sent) / dt,
            rtt if args.mode == "rr" else None,
            (cpu - last_cpu) / dt * 100.0,
        )
        last_t, last_cpu, last_sent, last_rtt_sum, last_replies = now, cpu, sent, rtt_sum, replies


def _summarize(
    args: argparse.Namespace, tasks: list[Task], local: str, peer: str, elapsed: float, cpu: float
) -> Summary:
    errors = [t.stats.error for t in tasks if t.stats.error]
    errors += ["task did not finish" for t in tasks if t.is_alive()]
    if args.mode == "rr":
        messages = sum(t.stats.replies for t in tasks)
    else:
        confirmed = [t.stats.confirmed for t in tasks]
        messages = sum(c if c is not None else t.stats.sent for c, t in zip(confirmed, tasks, strict=True))
    if messages == 0 and not errors:
        errors.append(f"no message completed in {elapsed:.2f} s")
    rtts = sorted(r for t in tasks for r in t.stats.rtts)
    rtt = None
    if rtts:
        rtt = {
            "min": round(rtts[0], 1),
            "avg": round(sum(rtts) / len(rtts), 1),
            "p50": round(percentile(rtts, 50), 1),
            "p99": round(percentile(rtts, 99), 1),
            "max": round(rtts[-1], 1),
        }
    elapsed = max(elapsed, 1e-9)
    rate = messages / elapsed
    return Summary(
        backend=tasks[0].backend if tasks else args.backend,
        mode=args.mode,
        size=args.size,
        ack_size=args.ack_size,
        depth=args.depth,
        tasks=args.tasks,
        local=local,
        peer=peer,
        port=args.port,
        seconds=round(elapsed, 3),
        messages=messages,
        msgs_per_s=round(rate, 1),
        mb_per_s=round(rate * args.size / 1e6, 3),
        rtt_us=rtt,
        cpu_pct=round(cpu, 1),
        errors=errors,
        transport=args.transport,
        send_waits=_waits(tasks),
    )


def _waits(tasks: Sequence[Any]) -> dict[str, float]:
    total = SendWaits()
    for t in tasks:
        total.add(t.stats.waits)
    return {"eagain": total.eagain, "enobufs": total.enobufs, "slept_s": round(total.slept, 3)}
