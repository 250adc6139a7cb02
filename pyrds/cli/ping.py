"""``pyrds ping DEST``: RDS reachability like rds-ping.

An RDS ping is a zero-length message to port 0 of the destination; the peer's RDS stack (kernel or pyrds
userspace, with ping_enable=1) answers from port 0 to the sending port. Pongs carry no payload, so, like
rds-ping, each outstanding ping uses its own socket from a small pool and the reply is matched by socket.
"""

from __future__ import annotations

import argparse
import errno
import selectors
import sys
import time
from dataclasses import dataclass, field

from pyrds.api import RDSSocketBase
from pyrds.cli.common import (
    UserError,
    add_backend_option,
    describe_oserror,
    open_socket,
    parse_ip,
    positive_float,
    positive_int,
    sockaddr,
    source_for,
)

POOL_SIZE = 8


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ping", help="send RDS pings (zero-length messages to port 0) and print round trips")
    p.add_argument("dest", help="destination IP address (v4 or v6)")
    p.add_argument(
        "-c", "--count", type=positive_int, default=None, help="stop after COUNT pings (default: until ^C)"
    )
    p.add_argument(
        "-i", "--interval", type=positive_float, default=1.0, help="seconds between pings (default 1)"
    )
    p.add_argument("-I", "--source", default=None, help="local address to send from (default: route source)")
    p.add_argument(
        "-W", "--timeout", type=positive_float, default=2.0, help="seconds to wait for each reply (default 2)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    add_backend_option(p)
    p.set_defaults(func=run)


@dataclass
class _Pending:
    seq: int
    sent: float


@dataclass
class PingStats:
    dest: str
    sent: int = 0
    received: int = 0
    errors: int = 0
    rtts_us: list[float] = field(default_factory=list)

    def summary(self) -> str:
        lost = self.sent - self.received
        loss = 100.0 * lost / self.sent if self.sent else 0.0
        lines = [
            f"--- {self.dest} rds ping statistics ---",
            f"{self.sent} pings sent, {self.received} replies received, {loss:.0f}% loss"
            + (f", {self.errors} send errors" if self.errors else ""),
        ]
        if self.rtts_us:
            r = self.rtts_us
            lines.append(f"rtt min/avg/max = {min(r):.0f}/{sum(r) / len(r):.0f}/{max(r):.0f} usec")
        return "\n".join(lines)


def _drain(sock: RDSSocketBase) -> None:
    while True:
        try:
            sock.recvmsg(64)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return
        except OSError:
            return


def run(args: argparse.Namespace) -> int:
    dest = parse_ip(args.dest, "destination")
    src = parse_ip(args.source, "source address") if args.source else source_for(dest)
    pool_size = min(args.count or POOL_SIZE, POOL_SIZE)
    socks: list[RDSSocketBase] = []
    stats = PingStats(dest)
    out = sys.stdout
    try:
        for _ in range(pool_size):
            s = open_socket(args.backend)
            socks.append(s)
            try:
                s.bind(sockaddr(src, 0))
            except OSError as exc:
                raise UserError(f"cannot bind to {src}: {describe_oserror(exc)}", 2) from None
            s.setblocking(False)
        if not args.quiet:
            print(f"RDS PING {dest} from {src} ({socks[0].backend} backend)", file=out, flush=True)
        _loop(args, socks, dest, stats)
    except KeyboardInterrupt:
        pass
    finally:
        for s in socks:
            s.close()
    print(stats.summary(), file=out, flush=True)
    return 0 if stats.received else 1


def _loop(args: argparse.Namespace, socks: list[RDSSocketBase], dest: str, stats: PingStats) -> None:
    sel = selectors.DefaultSelector()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        sel.register(fd, selectors.EVENT_READ)
    pending: dict[int, _Pending] = {}
    count: int | None = args.count
    seq = 0
    next_send = time.monotonic()
    while True:
        now = time.monotonic()
        if (count is None or seq < count) and now >= next_send:
            seq += 1
            sock = socks[(seq - 1) % len(socks)]
            fd = sock.fileno()
            if fd in pending and not args.quiet:
                print(f"{pending[fd].seq:4d}: no reply", flush=True)
            pending.pop(fd, None)
            _drain(sock)
            stats.sent += 1
            t0 = time.monotonic()
            try:
                sock.sendto(b"", sockaddr(dest, 0))
            except OSError as exc:
                stats.errors += 1
                if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL) and stats.sent == 1:
                    raise UserError(f"cannot ping {dest}: {describe_oserror(exc)}", 2) from None
                print(f"{seq:4d}: send failed: {describe_oserror(exc)}", file=sys.stderr, flush=True)
            else:
                pending[fd] = _Pending(seq, t0)
            next_send = t0 + args.interval
        # expire
        now = time.monotonic()
        for fd, p in list(pending.items()):
            if now - p.sent > args.timeout:
                del pending[fd]
                if not args.quiet:
                    print(f"{p.seq:4d}: no reply within {args.timeout:g} s", flush=True)
        done_sending = count is not None and seq >= count
        if done_sending and not pending:
            return
        deadlines = [p.sent + args.timeout for p in pending.values()]
        if not done_sending:
            deadlines.append(next_send)
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else args.interval
        for key, _ev in sel.select(wait):
            _receive(by_fd[int(key.fd)], int(key.fd), dest, pending, stats, args.quiet)


def _receive(
    sock: RDSSocketBase, fd: int, dest: str, pending: dict[int, _Pending], stats: PingStats, quiet: bool
) -> None:
    while True:
        try:
            _data, _anc, _flags, addr = sock.recvmsg(64)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return
        except OSError as exc:
            print(f"recv failed: {describe_oserror(exc)}", file=sys.stderr, flush=True)
            return
        t1 = time.monotonic()
        if not addr or addr[1] != 0:
            continue  # not a pong (pongs come from port 0)
        p = pending.pop(fd, None)
        if p is None:
            continue  # late pong of an expired ping
        rtt_us = (t1 - p.sent) * 1e6
        stats.received += 1
        stats.rtts_us.append(rtt_us)
        if not quiet:
            print(f"{p.seq:4d}: {rtt_us:.0f} usec  from {addr[0]}", flush=True)
