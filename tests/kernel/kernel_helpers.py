"""Helpers for kernel-only tests (run inside the VM guest; everything skips cleanly without AF_RDS).

Topology (created once per session, torn down at the end):
- ``rxe``: dummy link ``rdsd0`` with 10.77.0.1/24 and an rdma_rxe device on it; both IB sockets bind that
  same address (one guest: IB between different local IPs routes via lo and gets no reply).
- ``tcp``: veth ``rdsv0`` (10.78.0.1/24, fd78::1/64) in the test's netns <-> ``rdsv1`` (10.78.0.2/24,
  fd78::2/64) in netns ``rdspeer``; the peer socket is created inside that netns (a socket keeps its netns).
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from pyrds.constants import AF_RDS, SOL_RDS, SockOpt, Transport

T = TypeVar("T")

PEER_NS = "rdspeer"
TCP_A4, TCP_B4 = "10.78.0.1", "10.78.0.2"
TCP_A6, TCP_B6 = "fd78::1", "fd78::2"
RXE_IP = "10.77.0.1"


def _af_rds_reason() -> str | None:
    import socket

    try:
        s = socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    except OSError as exc:
        return f"no AF_RDS in this kernel ({exc.strerror}); kernel tests run in the VM guest"
    s.close()
    return None


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def modprobe(name: str) -> bool:
    if shutil.which("modprobe") is None:
        return False
    return sh("modprobe", name, check=False).returncode == 0


def run_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a thread that entered ``netns`` (sockets it creates belong to that netns)."""
    from pyrds.kernel import libc

    out: list[T] = []
    err: list[BaseException] = []

    def runner() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                libc.setns(fd, libc.CLONE_NEWNET)
            finally:
                os.close(fd)
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001
            err.append(exc)

    t = threading.Thread(target=runner)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def tcp_net_gen() -> Iterator[dict[str, str]]:
    if _af_rds_reason():
        pytest.skip("no AF_RDS")
    if not modprobe("rds_tcp"):
        pytest.skip("rds_tcp module not available")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2")
    sh("ip", "netns", "del", PEER_NS, check=False)
    sh("ip", "link", "del", "rdsv0", check=False)
    sh("ip", "netns", "add", PEER_NS)
    sh("ip", "link", "add", "rdsv0", "type", "veth", "peer", "name", "rdsv1")
    sh("ip", "link", "set", "rdsv1", "netns", PEER_NS)
    sh("ip", "addr", "add", f"{TCP_A4}/24", "dev", "rdsv0")
    sh("ip", "addr", "add", f"{TCP_A6}/64", "dev", "rdsv0", "nodad")
    sh("ip", "link", "set", "rdsv0", "up")
    sh("ip", "-n", PEER_NS, "addr", "add", f"{TCP_B4}/24", "dev", "rdsv1")
    sh("ip", "-n", PEER_NS, "addr", "add", f"{TCP_B6}/64", "dev", "rdsv1", "nodad")
    sh("ip", "-n", PEER_NS, "link", "set", "rdsv1", "up")
    sh("ip", "-n", PEER_NS, "link", "set", "lo", "up")
    yield {"a4": TCP_A4, "b4": TCP_B4, "a6": TCP_A6, "b6": TCP_B6, "peer_ns": PEER_NS}
    sh("ip", "link", "del", "rdsv0", check=False)
    sh("ip", "netns", "del", PEER_NS, check=False)


def rxe_gen() -> Iterator[str]:
    if _af_rds_reason():
        pytest.skip("no AF_RDS")
    if not modprobe("rds_rdma") or not modprobe("rdma_rxe"):
        pytest.skip("rds_rdma / rdma_rxe modules not available")
    if shutil.which("rdma") is None:
        pytest.skip("rdma tool (iproute2) missing")
    sh("ip", "link", "del", "rdsd0", check=False)
    sh("ip", "link", "add", "rdsd0", "type", "dummy")
    sh("ip", "addr", "add", f"{RXE_IP}/24", "dev", "rdsd0")
    sh("ip", "link", "set", "rdsd0", "up")
    r = sh("rdma", "link", "add", "rdsrxe0", "type", "rxe", "netdev", "rdsd0", check=False)
    if r.returncode != 0:
        sh("ip", "link", "del", "rdsd0", check=False)
        pytest.skip(f"cannot create rxe device: {r.stderr.strip()}")
    yield RXE_IP
    sh("rdma", "link", "del", "rdsrxe0", check=False)
    sh("ip", "link", "del", "rdsd0", check=False)


def make_socket(transport: Transport | None = None, netns: str | None = None) -> Any:
    from pyrds.kernel import RDSSocket

    def create() -> RDSSocket:
        s = RDSSocket()
        if transport is not None:
            s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(transport))
        return s

    return create() if netns is None else run_in_netns(netns, create)


def sockets_gen() -> Iterator[list[Any]]:
    """A list that closes every socket appended to it."""
    socks: list[Any] = []
    yield socks
    for s in socks:
        s.close()


def wait_readable(sock: Any, timeout: float = 10.0) -> None:
    r, _, _ = select.select([sock.fileno()], [], [], timeout)
    if not r:
        raise TimeoutError(f"socket not readable within {timeout}s")


def recv_full(sock: Any, bufsize: int = 65536, ancbufsize: int = 1024, timeout: float = 10.0) -> Any:
    """recvmsg once something is queued. POLLIN can be spurious (6.1 signals POLLIN when a congestion map
    arrives on a socket without RDS_CONG_MONITOR), so EAGAIN means poll again until the deadline."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing received within {timeout}s")
        r, _, _ = select.select([sock.fileno()], [], [], remaining)
        if not r:
            continue
        try:
            return sock.recvmsg(bufsize, ancbufsize, 0x40)  # MSG_DONTWAIT
        except BlockingIOError:
            time.sleep(0.01)


def page_buffer(size: int = 8192) -> tuple[Any, int]:
    """A page-aligned, zeroed ctypes buffer (mmap-backed) and its address."""
    import mmap

    mm = mmap.mmap(-1, size)
    buf = (ctypes.c_char * size).from_buffer(mm)
    return (mm, buf), ctypes.addressof(buf)


def errno_of(fn: Callable[[], Any]) -> int | None:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return None


def tcp_pair(net: dict[str, str], socks: list[Any], v6: bool = False, port: int = 4100) -> tuple[Any, Any]:
    """Socket A (this netns) and socket B (peer netns), both pinned to RDS/TCP and bound."""
    a = make_socket(Transport.TCP)
    socks.append(a)
    b = make_socket(Transport.TCP, netns=net["peer_ns"])
    socks.append(b)
    if v6:
        a.bind((net["a6"], port))
        b.bind((net["b6"], port + 1))
    else:
        a.bind((net["a4"], port))
        b.bind((net["b4"], port + 1))
    return a, b


def loop_pair(socks: list[Any], host: str = "127.0.0.1", port: int = 4200) -> tuple[Any, Any]:
    a = make_socket()
    socks.append(a)
    b = make_socket()
    socks.append(b)
    a.bind((host, port))
    b.bind((host, port + 1))
    return a, b


def ib_pair(ip: str, socks: list[Any], port: int = 4300) -> tuple[Any, Any]:
    a = make_socket(Transport.IB)
    socks.append(a)
    b = make_socket(Transport.IB)
    socks.append(b)
    a.bind((ip, port))
    b.bind((ip, port + 1))
    return a, b
