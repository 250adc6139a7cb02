"""The sender and receiver processes of the fan-in, many-sockets and queued-memory measurements.

benchmarks/sections.py starts them inside the benchmark's namespaces; each prints one JSON object per line on
stdout and takes one command per line on stdin (EOF ends it: the sockets stay open until then, so nothing
still queued in a sender's socket is dropped by an early close).

    agent.py count --backend B -s ADDR -p PORT           receiver: counts what arrives; "stop" -> drains
                                                         until 1 s idle, prints received/first-to-last rate
    agent.py send --backend B -s ADDR -r PEER -p PORT -n N -T SECONDS
                                                         opens and binds N sockets (ports chosen by bind),
                                                         timed; "go" -> sends one-way round-robin for T s
    agent.py hold --backend B -s ADDR -p PORT            receiver that does not read: "snap" (memory and
                                                         counters), "settle N", "drain"
    agent.py fill --backend B -s ADDR -r PEER -p PORT    sender: "warm N" (sent, waiting for space), "fill K"
                                                         (non-blocking, stops at the first EAGAIN/ENOBUFS)

Backends: ``stdlib`` (plain ``socket.socket(AF_RDS, SOCK_SEQPACKET)``, the kernel driven by the stdlib),
``kernel`` (``pyrds.socket("kernel")``), ``userspace`` (``pyrds.socket("userspace")``). Every socket gets the
stress default SO_SNDBUF/SO_RCVBUF of 4 MiB (``--sockbuf``; the FORCE variants, as root), messages are
zero-filled like ``pyrds stress``'s.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import selectors
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyrds.cli.stress_proto import (  # noqa: E402
    RETRY_ERRNOS,
    Stopped,
    StressError,
    send_retry,
    size_buffers,
    wait_fd,
)

AF_RDS = 21
SOCKBUF = 4 << 20
SERVICE_MARK = b"pyrds.userspace.service"


def emit(**doc: Any) -> None:
    print(json.dumps(doc), flush=True)


def open_socket(backend: str) -> Any:
    if backend == "stdlib":
        return socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    import pyrds

    return pyrds.socket(backend)  # type: ignore[arg-type]


def raise_nofile() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (512 userspace sockets are 512 control connections)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{exc.strerror or exc} [{errno.errorcode.get(exc.errno, exc.errno)}]"
    return f"{type(exc).__name__}: {exc}"


def commands() -> Any:
    for line in sys.stdin:
        words = line.split()
        if words:
            yield words


def recv_one(sock: Any) -> bytes | None:
    """One message from a non-blocking socket, None when nothing is queued."""
    try:
        return bytes(sock.recvmsg(65536)[0])
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in RETRY_ERRNOS:
            return None
        raise


def drain(sock: Any, idle: float) -> int:
    """Read until nothing arrived for ``idle`` seconds; how many messages were read."""
    n = 0
    last = time.monotonic()
    while time.monotonic() - last < idle:
        if recv_one(sock) is None:
            wait_fd(sock, selectors.EVENT_READ, 0.1)
            continue
        n += 1
        last = time.monotonic()
    return n


def receiver(args: argparse.Namespace) -> Any:
    sock = open_socket(args.backend)
    sock.bind((args.local, args.port))
    if args.sockbuf:
        size_buffers(sock, args.sockbuf)
    sock.setblocking(False)
    return sock


# ------------------------------------------------------------------------------------------- count / send


def cmd_count(args: argparse.Namespace) -> int:
    sock = receiver(args)
    emit(ready=True, port=args.port)
    sel = selectors.DefaultSelector()
    sel.register(sock.fileno(), selectors.EVENT_READ, "sock")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "ctl")
    received = nbytes = 0
    first = last = 0.0
    stop_at: float | None = None  # when "stop" came: end after ``idle`` seconds without a message
    mono = time.monotonic
    recvmsg = sock.recvmsg
    bufsize = max(4096, args.size + 64)  # what pyrds stress's passive side asks for
    while True:
        try:
            data = recvmsg(bufsize)[0]
        except BlockingIOError:
            data = None
        except OSError as exc:
            if exc.errno not in RETRY_ERRNOS:
                raise
            data = None
        if data is not None:
            last = mono()
            if not received:
                first = last
            received += 1
            nbytes += len(data)
            continue
        if stop_at is not None and mono() - max(last, stop_at) >= args.idle:
            break
        for key, _ev in sel.select(0.2):
            if key.data == "ctl":
                os.read(sys.stdin.fileno(), 4096)  # "stop" or EOF: either way, finish
                sel.unregister(sys.stdin.fileno())
                stop_at = mono()
    span = last - first
    emit(
        received=received,
        bytes=nbytes,
        seconds=round(span, 3),
        msgs_per_s=round(received / span, 1) if span > 0 else None,
    )
    sock.close()
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    raise_nofile()
    # one socket first, untimed: a userspace stack service that idled out is started here, not in the timing
    open_socket(args.backend).close()
    socks: list[Any] = []
    t0 = time.perf_counter()
    for _ in range(args.sockets):
        s = open_socket(args.backend)
        s.bind((args.local, 0))
        socks.append(s)
    open_bind = time.perf_counter() - t0
    ports = {s.getsockname()[1] for s in socks}
    for s in socks:
        if args.sockbuf:
            size_buffers(s, args.sockbuf)
        s.setblocking(False)
    emit(ready=True, sockets=len(socks), distinct_ports=len(ports), open_bind_s=round(open_bind, 4))
    if not sys.stdin.readline():  # EOF instead of "go": the driver gave up
        return 1
    payload = bytes(args.size)
    dest = (args.peer, args.port)
    stop = threading.Event()
    timer = threading.Timer(args.duration, stop.set)
    sent = 0
    error = None
    mono = time.monotonic
    t_start = mono()
    timer.start()
    try:
        n = len(socks)
        while not stop.is_set():
            send_retry(socks[sent % n], payload, dest, mono() + args.timeout, stop)
            sent += 1
    except Stopped:
        pass
    except (OSError, StressError) as exc:
        error = describe(exc)
    timer.cancel()
    emit(sent=sent, seconds=round(mono() - t_start, 3), error=error)
    sys.stdin.read()  # keep the sockets (and what they still queue) until told
    for s in socks:
        s.close()
    return 0


# --------------------------------------------------------------------------------------------- hold / fill


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemFree", "MemAvailable", "Slab", "SUnreclaim"):
            out[name] = int(rest.split()[0])  # kB
    return out


def service_pids() -> list[int]:
    """The userspace stack service(s) of this network namespace (cmdline has pyrds.userspace.service)."""
    me = os.stat("/proc/self/ns/net")
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            ns = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if SERVICE_MARK in cmdline and (ns.st_dev, ns.st_ino) == (me.st_dev, me.st_ino):
            pids.append(int(entry))
    return sorted(pids)


def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "RssAnon", "VmHWM"):
            out[name] = int(rest.split()[0])
    return out


class Holder:
    """The receiver of the queued-memory measurement: bound, never reading until told."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sock = receiver(args)

    def _info(self, info_type: int) -> list[Any]:
        if self.args.backend == "userspace":
            return list(self.sock.get_info(info_type))
        from pyrds.kernel.info import read_info  # a separate AF_RDS socket in this namespace

        return list(read_info(info_type))

    def queued(self) -> int:
        """Messages in this socket's receive queue (RDS_INFO_RECV_MESSAGES records for its address/port)."""
        from pyrds.constants import InfoType

        return sum(
            1
            for m in self._info(InfoType.RDS_INFO_RECV_MESSAGES)
            if m.lport == self.args.port and str(m.laddr) == self.args.local
        )

    def snap(self) -> dict[str, Any]:
        from pyrds.constants import InfoType
        from pyrds.info import counters_dict

        counters = counters_dict(self._info(InfoType.RDS_INFO_COUNTERS))
        doc: dict[str, Any] = {
            "t": round(time.monotonic(), 3),
            "meminfo_kb": _meminfo(),
            "counters": {
                k: counters.get(k)
                for k in ("recv_bytes_added_to_sock", "recv_bytes_freed_fromsock", "recv_queued")
            },
            "queued": self.queued(),
        }
        if self.args.backend == "userspace":
            pids = service_pids()
            doc["service_pids"] = pids
            doc["service_kb"] = _status_kb(pids[0]) if len(pids) == 1 else None
        return doc

    def settle(self, expect: int) -> dict[str, Any]:
        """Wait until ``expect`` messages are queued, or the count stood still for 3 s (60 s at most)."""
        t0 = time.monotonic()
        last, since = -1, t0
        while True:
            n = self.queued()
            now = time.monotonic()
            if n != last:
                last, since = n, now
            if n >= expect or now - since >= 3.0 or now - t0 >= 60.0:
                return {"queued": n, "waited_s": round(now - t0, 2)}
            time.sleep(0.2)


def cmd_hold(args: argparse.Namespace) -> int:
    h = Holder(args)
    emit(ready=True, port=args.port)
    for words in commands():
        try:
            if words[0] == "snap":
                emit(snap=h.snap())
            elif words[0] == "settle":
                emit(settled=h.settle(int(words[1])))
            elif words[0] == "drain":
                emit(drained=drain(h.sock, args.idle))
            else:
                emit(error=f"unknown command {words!r}")
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which records it in the row
            emit(error=describe(exc))
    h.sock.close()
    return 0


def cmd_fill(args: argparse.Namespace) -> int:
    sock = open_socket(args.backend)
    sock.bind((args.local, 0))
    if args.sockbuf:
        size_buffers(sock, args.sockbuf)
    sock.setblocking(False)
    emit(ready=True)
    payload = bytes(args.size)
    dest = (args.peer, args.port)
    for words in commands():
        try:
            if words[0] == "warm":
                for _ in range(int(words[1])):
                    send_retry(sock, payload, dest, time.monotonic() + args.timeout, threading.Event())
                emit(warm=int(words[1]))
            elif words[0] == "fill":
                emit(fill=fill(sock, payload, dest, int(words[1])))
            else:
                emit(error=f"unknown command {words!r}")
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            emit(error=describe(exc))
    sock.close()
    return 0


def fill(sock: Any, payload: bytes, dest: Any, limit: int) -> dict[str, Any]:
    """Send until the first EAGAIN/ENOBUFS or ``limit`` messages, never waiting."""
    sent, stop = 0, "limit"
    t0 = time.monotonic()
    while sent < limit:
        try:
            sock.sendto(payload, dest)
        except BlockingIOError:
            stop = "EAGAIN"
            break
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ENOBUFS):
                stop = errno.errorcode[exc.errno]
                break
            raise
        sent += 1
    return {"sent": sent, "stop": stop, "seconds": round(time.monotonic() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=("count", "send", "hold", "fill"))
    ap.add_argument("--backend", choices=("stdlib", "kernel", "userspace"), required=True)
    ap.add_argument("-s", dest="local", required=True)
    ap.add_argument("-r", dest="peer")
    ap.add_argument("-p", dest="port", type=int, required=True)
    ap.add_argument("-q", dest="size", type=int, default=1024)
    ap.add_argument("-n", dest="sockets", type=int, default=1)
    ap.add_argument("-T", dest="duration", type=float, default=5.0)
    ap.add_argument("-W", dest="timeout", type=float, default=30.0, help="send stall limit (30 s)")
    ap.add_argument("--sockbuf", type=int, default=SOCKBUF, help="SO_SNDBUF/SO_RCVBUF (4 MiB; 0 = default)")
    ap.add_argument("--idle", type=float, default=1.0, help="drain: seconds without a message that end it")
    args = ap.parse_args(argv)
    if args.role in ("send", "fill") and not args.peer:
        ap.error(f"{args.role} needs -r PEER")
    return {"count": cmd_count, "send": cmd_send, "hold": cmd_hold, "fill": cmd_fill}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
