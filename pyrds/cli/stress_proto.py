"""Wire conventions of ``pyrds stress`` and the passive (server) side.

Data messages are zero-filled payloads of the requested size. Control messages start with ``MAGIC`` followed
by JSON: ``hello`` (mode, ack size) -> ``ready``; ``fin`` -> ``done`` (what the passive side received).
A zero-filled data message can never start with MAGIC, so every size, including 0 bytes, is usable.
"""

from __future__ import annotations

import errno
import json
import select
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pyrds.api import RDSSocketBase

MAGIC = b"\xfePYRDS-STRESS\x01"
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RECV_BUF = (1 << 20) + 64
RETRY_ERRNOS = (errno.EAGAIN, errno.ENOBUFS, errno.ETIMEDOUT, errno.EINTR)


class StressError(Exception):
    """A run failed (peer silent, send error); printed as one line."""


class Stopped(Exception):
    """The run ended while a send was waiting for space: that message was not sent (normal end)."""


def control(op: str, **fields: Any) -> bytes:
    return MAGIC + json.dumps({"op": op, **fields}).encode()


def parse_control(data: bytes) -> dict[str, Any] | None:
    if not data.startswith(MAGIC):
        return None
    try:
        doc = json.loads(data[len(MAGIC) :])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def size_buffers(sock: RDSSocketBase, nbytes: int) -> None:
    """Raise SO_SNDBUF/SO_RCVBUF (the FORCE variants when allowed, like rds-stress as root); best effort."""
    for force, plain in ((SO_SNDBUFFORCE, socket.SO_SNDBUF), (SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        for opt in (force, plain):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, nbytes)
                break
            except OSError:
                continue


#: per thread: one ``select.poll`` object per (fd, events) waited on. A poll object holds no kernel state
#: (each wait is one poll(2) over the registered fds), so a closed fd whose number comes back is waited on
#: correctly. It replaced a ``selectors.DefaultSelector`` made per wait: epoll_create1, epoll_ctl, epoll_wait
#: and close for every message (18 us against 1.7 us per wait on the host), a cost the stdlib-kernel baseline
#: of the benchmark paid at every receive (docs/benchmarks.md).
_polls = threading.local()
_POLLS_MAX = 64


def wait_fd(sock: RDSSocketBase, events: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``events`` (selectors.EVENT_READ / EVENT_WRITE) on ``sock``; True
    when poll(2) reported anything (an error or hangup too: the caller's next call says what)."""
    fd = sock.fileno()
    cache: dict[tuple[int, int], select.poll] | None = getattr(_polls, "by_fd", None)
    if cache is None:
        cache = _polls.by_fd = {}
    poller = cache.get((fd, events))
    if poller is None:
        if len(cache) >= _POLLS_MAX:
            cache.clear()
        mask = (select.POLLIN if events & selectors.EVENT_READ else 0) | (
            select.POLLOUT if events & selectors.EVENT_WRITE else 0
        )
        poller = cache[(fd, events)] = select.poll()
        poller.register(fd, mask)
    # poll's timeout is in ms (rounded up, as selectors does); never negative: that would wait forever
    return bool(poller.poll(max(0.0, timeout) * 1000.0))


@dataclass
class SendWaits:
    """What a sender waited for (``pyrds stress --json`` reports it): refusals of a full send queue (EAGAIN),
    of a congested peer (ENOBUFS), and the seconds slept backing off."""

    eagain: int = 0
    enobufs: int = 0
    slept: float = 0.0

    def add(self, other: SendWaits) -> None:
        self.eagain += other.eagain
        self.enobufs += other.enobufs
        self.slept += other.slept


def send_retry(
    sock: RDSSocketBase,
    data: bytes,
    addr: Any,
    deadline: float,
    stop: threading.Event,
    waits: SendWaits | None = None,
) -> None:
    """Send on a non-blocking socket, waiting out a full send queue or a congested peer until ``deadline``.

    A full send queue (EAGAIN) is waited out on POLLOUT, which says exactly when there is room (rds_poll),
    and retried at once; only an EAGAIN right after POLLOUT said writable backs off. A congested peer
    (ENOBUFS) is not reflected in POLLOUT, so that retry backs off (0.5 ms doubling to 20 ms)."""
    backoff = 0.0005
    writable = False  # POLLOUT came before this attempt
    while True:
        try:
            sock.sendto(data, addr)
            return
        except BlockingIOError:
            congested = False
        except OSError as exc:
            if exc.errno not in RETRY_ERRNOS:
                raise
            congested = exc.errno == errno.ENOBUFS
        if waits is not None:
            if congested:
                waits.enobufs += 1
            else:
                waits.eagain += 1
        if stop.is_set():
            raise Stopped
        if time.monotonic() > deadline:
            raise StressError("send stalled: the peer is not draining (congested or unreachable)")
        if not congested and not writable:
            writable = wait_fd(sock, selectors.EVENT_WRITE, 0.05)
            continue
        if not wait_fd(sock, selectors.EVENT_WRITE, 0.05):
            writable = False
            continue
        writable = True
        time.sleep(backoff)
        if waits is not None:
            waits.slept += backoff
        backoff = min(backoff * 2, 0.02)


def recv_wait(sock: RDSSocketBase, timeout: float, bufsize: int = RECV_BUF) -> tuple[bytes, Any] | None:
    """One message from a non-blocking socket, or None after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        try:
            data, _anc, _flags, addr = sock.recvmsg(bufsize)
            return data, addr
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno not in RETRY_ERRNOS:
                raise
        left = end - time.monotonic()
        if left <= 0:
            return None
        wait_fd(sock, selectors.EVENT_READ, min(left, 0.2))


@dataclass
class _Peer:
    mode: str
    ack: int
    started: float
    received: int = 0
    rbytes: int = 0


def serve(
    sock: RDSSocketBase,
    once: bool,
    as_json: bool,
    out: Any = None,
    stop: threading.Event | None = None,
) -> int:
    """Answer stress clients until SIGINT/SIGTERM (or, with ``once``, until the first run finishes). With
    ``stop`` (serving from a thread other than the main one, where no signal handler can be set), until
    ``stop`` is set instead of SIGTERM."""
    out = out or sys.stdout
    own_signal = stop is None
    old: Any = None
    if stop is None:
        stop = threading.Event()
        old = signal.signal(signal.SIGTERM, _setter(stop))
    peers: dict[Any, _Peer] = {}
    acks: dict[int, bytes] = {}
    finished = 0
    bufsize = 4096
    sock.setblocking(False)
    try:
        while not stop.is_set():
            try:
                data, _anc, _flags, addr = sock.recvmsg(bufsize)
            except BlockingIOError:
                wait_fd(sock, selectors.EVENT_READ, 0.2)
                continue
            except OSError as exc:
                if exc.errno in RETRY_ERRNOS:
                    wait_fd(sock, selectors.EVENT_READ, 0.2)
                    continue
                raise
            peer = peers.get(addr)
            if peer is not None and not data.startswith(MAGIC):
                peer.received += 1
                peer.rbytes += len(data)
                if peer.mode == "rr":
                    reply = acks.get(peer.ack)
                    if reply is None:
                        reply = acks.setdefault(peer.ack, bytes(peer.ack))
                    try:
                        send_retry(sock, reply, addr, time.monotonic() + 30.0, stop)
                    except Stopped:
                        break
                continue
            ctl = parse_control(data)
            if ctl is None:
                continue  # data from a peer that never said hello: ignore
            op = ctl.get("op")
            if op == "hello":
                mode = "rr" if ctl.get("mode") == "rr" else "oneway"
                peers[addr] = _Peer(mode, max(0, int(ctl.get("ack", 0))), time.monotonic())
                bufsize = max(bufsize, min(RECV_BUF, int(ctl.get("size", 0)) + 64))
                send_retry(sock, control("ready"), addr, time.monotonic() + 10.0, stop)
            elif op == "fin" and addr in peers:
                p = peers.pop(addr)
                elapsed = max(time.monotonic() - p.started, 1e-9)
                send_retry(
                    sock,
                    control("done", received=p.received, bytes=p.rbytes),
                    addr,
                    time.monotonic() + 10.0,
                    stop,
                )
                _report_peer(out, addr, p, elapsed, as_json)
                finished += 1
                if once and not peers:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        if own_signal:
            signal.signal(signal.SIGTERM, old)
    return 0 if (finished or not once) else 1


def _setter(stop: threading.Event) -> Any:
    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    return on_signal


def _report_peer(out: Any, addr: Any, p: _Peer, elapsed: float, as_json: bool) -> None:
    rate = p.received / elapsed
    if as_json:
        doc = {
            "role": "passive",
            "peer": list(addr),
            "mode": p.mode,
            "received": p.received,
            "bytes": p.rbytes,
            "seconds": round(elapsed, 3),
            "msgs_per_s": round(rate, 1),
        }
        print(json.dumps(doc), file=out, flush=True)
    else:
        print(
            f"peer {addr[0]}:{addr[1]} ({p.mode}): received {p.received} msgs, {p.rbytes} bytes "
            f"in {elapsed:.2f} s ({rate:.0f} msgs/s)",
            file=out,
            flush=True,
        )
