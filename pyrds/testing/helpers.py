"""Small assertion and polling helpers shared by the conformance scenarios (local or agent sockets)."""

from __future__ import annotations

import errno
import select
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from pyrds.testing.workloads import drain_ready

POLL_BITS = {
    select.POLLIN: "POLLIN",
    select.POLLPRI: "POLLPRI",
    select.POLLOUT: "POLLOUT",
    select.POLLERR: "POLLERR",
    select.POLLHUP: "POLLHUP",
    select.POLLNVAL: "POLLNVAL",
    select.POLLRDNORM: "POLLRDNORM",
    select.POLLWRNORM: "POLLWRNORM",
    select.POLLWRBAND: "POLLWRBAND",
}
ALL_EVENTS = (
    select.POLLIN
    | select.POLLOUT
    | select.POLLPRI
    | select.POLLRDNORM
    | select.POLLWRNORM
    | select.POLLWRBAND
)


def errno_of(fn: Callable[..., Any], *args: Any) -> int | str:
    """Call ``fn``; return 0 on success, the errno name on OSError."""
    try:
        fn(*args)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno)) if exc.errno else type(exc).__name__
    return 0


def expect_errno(code: int, fn: Callable[..., Any], *args: Any) -> OSError:
    """Assert ``fn(*args)`` raises OSError with ``code`` (named in the failure message)."""
    with pytest.raises(OSError) as info:
        fn(*args)
    got = info.value.errno
    assert got == code, (
        f"expected {errno.errorcode[code]}, got {errno.errorcode.get(got or 0, got)}: {info.value!r}"
    )
    return info.value


def poll_mask(sock: Any, timeout_ms: int = 0, events: int = ALL_EVENTS) -> int:
    """poll(2) revents for a local socket (``fileno``) or an agent socket (``poll`` RPC)."""
    if hasattr(sock, "agent"):
        mask: int = sock.poll(events, timeout_ms)
        return mask
    p = select.poll()
    p.register(sock.fileno(), events)
    res = p.poll(timeout_ms)
    return res[0][1] if res else 0


def mask_names(mask: int) -> list[str]:
    return [name for bit, name in POLL_BITS.items() if mask & bit]


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def wait_readable(sock: Any, timeout: float = 10.0) -> bool:
    return bool(poll_mask(sock, int(timeout * 1000), select.POLLIN) & select.POLLIN)


def sockaddr_in(host: str, port: int) -> bytes:
    """A raw ``struct sockaddr_in`` (for RDS_CANCEL_SENT_TO)."""
    return struct.pack("=HH4s8x", socket.AF_INET, socket.htons(port), socket.inet_aton(host))


def sockaddr_in6(host: str, port: int, scope_id: int = 0) -> bytes:
    return struct.pack(
        "=HHI16sI", socket.AF_INET6, socket.htons(port), 0, socket.inet_pton(socket.AF_INET6, host), scope_id
    )


def norm_addr(addr: Any, ports: dict[int, str] | None = None) -> Any:
    """Address with autobound ports replaced by stable names (for comparing two backends)."""
    if not isinstance(addr, tuple) or len(addr) < 2:
        return addr
    port = addr[1]
    if ports is not None and port in ports:
        port = ports[port]
    return (addr[0], port, *addr[2:])


def drain_nonblocking(sock: Any, bufsize: int = 1 << 20) -> list[tuple[bytes, Any]]:
    return list(drain_ready(sock, bufsize, socket.MSG_DONTWAIT))


def send_until_enobufs(
    sender: Any, dest: Any, size: int, timeout: float, limit: int | None = None, pause: float = 0.01
) -> tuple[int, bool]:
    """Non-blocking sends of ``size`` bytes to ``dest`` until ENOBUFS (the destination's congestion map says
    its port is congested), EAGAIN retried after ``pause``; stops after ``timeout`` s or ``limit`` messages.
    Returns (messages sent, whether ENOBUFS came); any other error is raised."""
    sent = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (limit is None or sent < limit):
        try:
            sender.sendto(b"c" * size, socket.MSG_DONTWAIT, dest)
            sent += 1
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                return sent, True
            if exc.errno != errno.EAGAIN:
                raise
            time.sleep(pause)
    return sent, False


def send_when_uncongested(sender: Any, data: bytes, dest: Any, timeout: float, pause: float = 0.05) -> None:
    """Send ``data`` non-blocking, retrying ENOBUFS and EAGAIN (every ``pause`` s) until the destination's
    port is clear; AssertionError with the last error after ``timeout`` s, any other error raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sender.sendto(data, socket.MSG_DONTWAIT, dest)
            return
        except OSError as exc:
            assert exc.errno in (errno.ENOBUFS, errno.EAGAIN) and time.monotonic() < deadline, exc
            time.sleep(pause)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL (a server started for a test)."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
