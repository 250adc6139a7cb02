"""Per-call cost of the kernel backend against the stdlib socket on the same kernel (guest, root, AF_RDS).

One process, RDS over the loop transport (127.0.0.1 / ::1): a loop of ``sendto`` + ``recvfrom`` at 0 B,
1 KiB and 64 KiB on IPv4 and IPv6, and ``sendmsg`` + ``recvmsg`` at 1 KiB, each driven by

- ``stdlib``: plain ``socket.socket(AF_RDS, SOCK_SEQPACKET)`` (IPv6: an ``AF_INET6``-family
  ``socket.socket`` on an AF_RDS fd, the only way the stdlib speaks ``sockaddr_in6`` to RDS), the baseline;
- ``floor``: :class:`FloorSocket`, the stdlib socket behind one do-nothing Python function per data call
  (the least a pure-Python wrapper costs);
- ``pyrds.kernel``: ``pyrds.socket("kernel")``;
- optionally ``--before FILE``: another implementation of the kernel backend's ``RDSSocket`` (e.g. the
  pre-fast-path pyrds/kernel/socket.py from git), loaded from that file, for a before/after table.

Batches of the variants alternate (A B A B ...) so that load changes hit all of them alike; a cell is the
per-iteration time of the best batch (the least disturbed one) and the median batch.

    python benchmarks/percall.py [--rounds 30] [--before build/old_socket.py] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

AF_RDS = 21
BUF = 1 << 20
# (label, size, IP version, "sendto" | "sendmsg" | "reply")
CASES = [
    ("sendto+recvfrom 0 B v4", 0, 4, "sendto"),
    ("sendto+recvfrom 1 KiB v4", 1024, 4, "sendto"),
    ("sendto+recvfrom 64 KiB v4", 65536, 4, "sendto"),
    ("sendto+recvfrom 0 B v6", 0, 6, "sendto"),
    ("sendto+recvfrom 1 KiB v6", 1024, 6, "sendto"),
    ("sendto+recvfrom 64 KiB v6", 65536, 6, "sendto"),
    ("sendmsg+recvmsg 1 KiB v4", 1024, 4, "sendmsg"),
    ("sendmsg+recvmsg 1 KiB v6", 1024, 6, "sendmsg"),
    # a server's reply to the source recvfrom returned (a new address tuple every time): two sends and two
    # receives per iteration
    ("reply to the source 1 KiB v4", 1024, 4, "reply"),
    ("reply to the source 1 KiB v6", 1024, 6, "reply"),
]


def stdlib_socket(version: int) -> Any:
    if version == 4:
        return socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    fd = socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0).detach()
    return socket.socket(socket.AF_INET6, socket.SOCK_SEQPACKET, 0, fileno=fd)


class FloorSocket:
    """The stdlib socket with one Python function between the caller and each data call, doing nothing but
    pass its arguments on (the argument-count test and the ``flags is 0`` test pyrds's closures make too):
    the least any pure-Python socket wrapper costs per call. pyrds.kernel against this column is what
    pyrds's own work costs; this column against the stdlib is the price of one Python frame."""

    def __init__(self, version: int) -> None:
        self._sock = sock = stdlib_socket(version)
        c_sendto, c_recvfrom, c_sendmsg, c_recvmsg = sock.sendto, sock.recvfrom, sock.sendmsg, sock.recvmsg
        noarg: Any = object()
        zero = 0

        def sendto(data: Any, flags_or_address: Any, address: Any = noarg, /) -> int:
            if address is noarg:
                return c_sendto(data, flags_or_address)  # type: ignore[no-any-return]
            return c_sendto(data, flags_or_address, address)  # type: ignore[no-any-return]

        def recvfrom(bufsize: Any, flags: Any = 0) -> Any:
            if flags is zero:
                return c_recvfrom(bufsize)
            return c_recvfrom(bufsize, flags)

        def sendmsg(buffers: Any, ancdata: Any = (), flags: Any = 0, address: Any = None) -> int:
            if address is None:
                return c_sendmsg(buffers, ancdata, flags)  # type: ignore[no-any-return]
            return c_sendmsg(buffers, ancdata, flags, address)  # type: ignore[no-any-return]

        def recvmsg(bufsize: Any, ancbufsize: Any = 0, flags: Any = 0) -> Any:
            return c_recvmsg(bufsize, ancbufsize, flags)

        self.sendto, self.recvfrom, self.sendmsg, self.recvmsg = sendto, recvfrom, sendmsg, recvmsg

    def __getattr__(self, name: str) -> Any:  # setsockopt, bind, getsockname, close
        return getattr(self._sock, name)


def floor_socket(version: int) -> Any:
    return FloorSocket(version)


def pyrds_socket(version: int) -> Any:
    import pyrds

    return pyrds.socket("kernel")


def loaded_socket(path: str) -> Callable[[int], Any]:
    spec = importlib.util.spec_from_file_location("pyrds_kernel_socket_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda version: module.RDSSocket()


def make_pair(factory: Callable[[int], Any], version: int) -> tuple[Any, Any, Any]:
    host: tuple[Any, ...] = ("127.0.0.1", 0) if version == 4 else ("::1", 0, 0, 0)
    a, b = factory(version), factory(version)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
        s.bind(host)
    return a, b, b.getsockname()


def batch(a: Any, b: Any, dest: Any, size: int, kind: str, n: int) -> float:
    """Seconds per iteration of n iterations (one message each)."""
    payload = b"x" * size
    if kind == "sendto":
        sendto, recvfrom = a.sendto, b.recvfrom
        t0 = time.perf_counter()
        for _ in range(n):
            sendto(payload, dest)
            recvfrom(65536)
        return (time.perf_counter() - t0) / n
    if kind == "reply":
        sendto, recvfrom, reply, back = a.sendto, b.recvfrom, b.sendto, a.recvfrom
        t0 = time.perf_counter()
        for _ in range(n):
            sendto(payload, dest)
            data, source = recvfrom(65536)
            reply(data, source)
            back(65536)
        return (time.perf_counter() - t0) / n
    sendmsg, recvmsg = a.sendmsg, b.recvmsg
    bufs = [payload]
    t0 = time.perf_counter()
    for _ in range(n):
        sendmsg(bufs, [], 0, dest)
        recvmsg(65536)
    return (time.perf_counter() - t0) / n


def measure(variants: dict[str, Callable[[int], Any]], rounds: int, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for label, size, version, kind in CASES:
        n = 20 if size >= 65536 else 200
        if quick:
            n = max(5, n // 10)
        pairs = {name: make_pair(f, version) for name, f in variants.items()}
        # sanity: every variant delivers the message and the sender's address
        for name, (a, b, dest) in pairs.items():
            a.sendto(b"check", dest)
            data, src = b.recvfrom(100)
            if data != b"check" or src[:2] != a.getsockname()[:2]:
                raise RuntimeError(f"{name}: {label}: got {data!r} from {src}")
        times: dict[str, list[float]] = {name: [] for name in variants}
        for a, b, dest in pairs.values():
            batch(a, b, dest, size, kind, max(2, n // 10))  # warm up
        for _ in range(rounds):
            for name, (a, b, dest) in pairs.items():
                times[name].append(batch(a, b, dest, size, kind, n))
        for a, b, _dest in pairs.values():
            a.close()
            b.close()
        row: dict[str, Any] = {"case": label, "size": size, "ip": version, "call": kind, "iterations": n}
        if "pyrds.kernel" in pairs:  # which data calls pyrds.kernel ran: its C module's, or the closures
            row["pyrds_kernel_calls"] = type(pairs["pyrds.kernel"][1].recvfrom).__name__
        for name, ts in times.items():
            row[name] = {"best_us": min(ts) * 1e6, "median_us": statistics.median(ts) * 1e6}
        rows.append(row)
        cells = "  ".join(
            f"{k} {v['best_us']:.1f}/{v['median_us']:.1f}" for k, v in row.items() if isinstance(v, dict)
        )
        print(f"[percall] {label:28} best/median us: {cells}", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30, help="batches per variant and case (30)")
    ap.add_argument("--before", help="a file defining another RDSSocket for the kernel (the 'before' column)")
    ap.add_argument("--quick", action="store_true", help="tiny batches (a smoke test, not a measurement)")
    ap.add_argument("--json", action="store_true", help="print one PYRDS-PERCALL-JSON line")
    args = ap.parse_args(argv)
    variants: dict[str, Callable[[int], Any]] = {
        "stdlib": stdlib_socket,
        "floor": floor_socket,
        "pyrds.kernel": pyrds_socket,
    }
    if args.before:
        variants["before"] = loaded_socket(args.before)
    rows = measure(variants, args.rounds, args.quick)
    if args.json:
        print("PYRDS-PERCALL-JSON " + json.dumps(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
