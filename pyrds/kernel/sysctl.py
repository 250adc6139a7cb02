"""RDS sysctls: ``/proc/sys/net/rds/*`` and ``/proc/sys/net/rds/tcp/*``.

``/proc/sys/net`` shows the network namespace of the thread that opens the file, so a named namespace is read
or written from a short-lived thread that ``setns()``-es into it (the calling thread never moves).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pyrds.kernel import libc

T = TypeVar("T")

PROC_RDS = Path("/proc/sys/net/rds")
RDS_SYSCTLS = (
    "reconnect_min_delay_ms",
    "reconnect_max_delay_ms",
    "max_unacked_packets",
    "max_unacked_bytes",
    "ping_enable",
)
RDS_TCP_SYSCTLS = ("rds_tcp_sndbuf", "rds_tcp_rcvbuf")


def _path(name: str) -> Path:
    if name in RDS_TCP_SYSCTLS:
        return PROC_RDS / "tcp" / name
    if name.startswith("tcp/") and name[4:] in RDS_TCP_SYSCTLS:
        return PROC_RDS / name
    if name in RDS_SYSCTLS:
        return PROC_RDS / name
    raise ValueError(f"unknown RDS sysctl {name!r}")


def _netns_path(netns: str) -> str:
    return netns if "/" in netns else f"/run/netns/{netns}"


def _in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    if netns is None:
        return fn()
    path = _netns_path(netns)
    result: list[T] = []
    error: list[BaseException] = []

    def runner() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc.setns(fd, libc.CLONE_NEWNET)
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            error.append(exc)

    t = threading.Thread(target=runner, name=f"pyrds-netns-{netns}")
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def read(name: str, netns: str | None = None) -> int:
    """Value of sysctl ``name`` (``"ping_enable"``, ``"rds_tcp_sndbuf"``...) of the current or named netns."""
    path = _path(name)
    return _in_netns(netns, lambda: int(path.read_text().split()[0]))


def write(name: str, value: int, netns: str | None = None) -> None:
    """Set sysctl ``name``. Writing rds_tcp_sndbuf/rcvbuf drops every RDS/TCP connection of that netns."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("sysctl value must be int")
    path = _path(name)

    def do() -> None:
        with open(path, "w") as f:
            f.write(f"{value}\n")

    _in_netns(netns, do)


def read_all(netns: str | None = None) -> dict[str, int]:
    """Every RDS sysctl that exists (tcp ones only when rds_tcp is loaded)."""

    def collect() -> dict[str, int]:
        out: dict[str, int] = {}
        for n in RDS_SYSCTLS + RDS_TCP_SYSCTLS:
            p = _path(n)
            if p.exists():
                out[n] = int(p.read_text().split()[0])
        return out

    return _in_netns(netns, collect)
