"""Guest test: ``pyrds.socket("userspace")`` sockets pinned to RDS/IB talk to a kernel AF_RDS socket pinned to
RDS/IB (rds_rdma) over rdma_rxe, in the initial namespace (not a pytest module: run it in a QEMU guest)::

    python -m vm run --kernel 7.3 --cpus 1 --timeout 600 \\
        --modules rds,rds_rdma,rdma_rxe,ib_uverbs,rdma_ucm,dummy \\
        -- python tests/unit/userspace/ib/guest_socket_ib.py

One dummy netdev holds both addresses (kernel K, userspace U) and one rxe device (guest_smoke_ib.py: a veth
pair in one namespace fails with ADDR_ERROR); a second dummy netdev without an rxe device gives an address
that an IB socket may not bind. The userspace stack service is started by the first userspace socket (a
fresh PYRDS_STACK_NAME, its log in /tmp), after the rxe device exists. The kernel's rds_rdma listens on
rdma_cm port 18634, so the service's IB node for U runs active-only (its log says so): U dials K, and K's
replies come back on that connection.

Checked: SO_RDS_TRANSPORT=IB and the errno of binding an IB socket to an address without an RDMA device,
on both backends; then messages of 0, 1, 4096, 4097, 64 KiB and 1 MiB each way (payload, source address and
port); the userspace RDS_INFO_CONNECTIONS row ("infiniband"); the service log.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.getcwd())

import pyrds  # noqa: E402
from pyrds.constants import SOL_RDS, InfoType, SockOpt  # noqa: E402

AF_RDS = 21
RDS_TRANS_IB = 0
K_IP, U_IP, NODEV_IP = "10.78.0.1", "10.78.0.2", "10.78.1.1"
K_PORT, U_PORT = 4100, 4200
SIZES = [0, 1, 4096, 4097, 65536, 1 << 20]
BUF = 4 << 20
TIMEOUT = 60.0


def sh(*cmd: str, check: bool = True) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = (r.stdout + r.stderr).strip()
    print(f"$ {' '.join(cmd)} -> {r.returncode}{(chr(10) + out) if out else ''}", flush=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd} failed")


def payload(n: int, salt: int) -> bytes:
    return bytes((i * 31 + salt) & 0xFF for i in range(n))


def up() -> None:
    sh("modprobe", "rds_rdma")
    sh("ip", "link", "add", "ibsk0", "type", "dummy")
    sh("ip", "addr", "add", f"{K_IP}/24", "dev", "ibsk0")
    sh("ip", "addr", "add", f"{U_IP}/24", "dev", "ibsk0")
    sh("ip", "link", "set", "ibsk0", "up")
    sh("rdma", "link", "add", "ibskrxe0", "type", "rxe", "netdev", "ibsk0")
    sh("ip", "link", "add", "ibsk1", "type", "dummy")
    sh("ip", "addr", "add", f"{NODEV_IP}/24", "dev", "ibsk1")
    sh("ip", "link", "set", "ibsk1", "up")
    time.sleep(0.5)  # GID table population is asynchronous
    sh("rdma", "link", "show", check=False)
    for name in ("wmem_max", "rmem_max"):
        with open(f"/proc/sys/net/core/{name}", "w") as f:
            f.write(str(BUF))


def down() -> None:
    sh("rdma", "link", "delete", "ibskrxe0", check=False)
    sh("ip", "link", "del", "ibsk0", check=False)
    sh("ip", "link", "del", "ibsk1", check=False)


def bind_errno(s: Any, addr: tuple[str, int]) -> int:
    try:
        s.bind(addr)
    except OSError as exc:
        return exc.errno or -1
    return 0


def check(ok: bool, what: str, results: list[bool]) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    results.append(ok)


def main() -> int:
    os.environ["PYRDS_STACK_NAME"] = f"pyrds-guest-ib-{uuid.uuid4().hex[:8]}"
    log_path = f"/tmp/{os.environ['PYRDS_STACK_NAME']}.log"
    os.environ["PYRDS_STACK_LOG"] = log_path
    os.environ["PYRDS_LOG"] = "INFO"
    results: list[bool] = []
    up()
    ks = us = None
    try:
        # -- socket semantics on both backends
        for backend in ("kernel", "userspace"):
            s: Any = socket.socket(AF_RDS, socket.SOCK_SEQPACKET) if backend == "kernel" else None
            s = s or pyrds.socket("userspace")
            s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, RDS_TRANS_IB)
            got = s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT)
            check(got == RDS_TRANS_IB, f"{backend}: SO_RDS_TRANSPORT=IB, getsockopt {got}", results)
            e = bind_errno(s, (NODEV_IP, 4300))
            check(
                e == errno.ENOPROTOOPT,
                f"{backend}: IB socket bind to {NODEV_IP} (no RDMA device): {errno.errorcode.get(e, e)}",
                results,
            )
            s.close()

        ks = socket.socket(AF_RDS, socket.SOCK_SEQPACKET)
        ks.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, RDS_TRANS_IB)
        us = pyrds.socket("userspace")
        us.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, RDS_TRANS_IB)
        for s in (ks, us):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
            s.settimeout(TIMEOUT)
        ks.bind((K_IP, K_PORT))
        us.bind((U_IP, U_PORT))
        # -- data, each size both ways
        for i, n in enumerate(SIZES):
            data = payload(n, i)
            t0 = time.monotonic()
            us.sendto(data, (K_IP, K_PORT))
            try:
                got, addr = ks.recvfrom(BUF)
            except OSError as exc:
                check(False, f"userspace->kernel {n} B: {exc}", results)
                break
            dt = time.monotonic() - t0
            check(
                got == data and tuple(addr)[:2] == (U_IP, U_PORT),
                f"userspace->kernel {n} B: kernel got {len(got)} B from {addr} in {dt:.2f} s",
                results,
            )
            back = data[::-1]
            t0 = time.monotonic()
            ks.sendto(back, (U_IP, U_PORT))
            try:
                got, addr = us.recvfrom(BUF)
            except OSError as exc:
                check(False, f"kernel->userspace {n} B: {exc}", results)
                break
            dt = time.monotonic() - t0
            check(
                got == back and tuple(addr)[:2] == (K_IP, K_PORT),
                f"kernel->userspace {n} B: userspace got {len(got)} B from {addr} in {dt:.2f} s",
                results,
            )
        rows = us.get_info(InfoType.RDS_INFO_CONNECTIONS)
        for r in rows:
            print(f"  userspace connection: {r}", flush=True)
        check(
            any((str(r.laddr), str(r.faddr), r.transport) == (U_IP, K_IP, "infiniband") for r in rows),
            "userspace RDS_INFO_CONNECTIONS has the infiniband row",
            results,
        )
        try:
            krows = pyrds.socket("kernel").get_info(InfoType.RDS_INFO_CONNECTIONS)
            for r in krows:
                print(f"  kernel connection: {r}", flush=True)
        except (OSError, AttributeError) as exc:
            print(f"  kernel info: {exc}", flush=True)
    finally:
        for s in (us, ks):
            if s is not None:
                s.close()
        time.sleep(0.5)
        try:
            with open(log_path) as f:
                print("--- service log ---\n" + f.read().strip() + "\n---", flush=True)
        except OSError as exc:
            print(f"no service log: {exc}")
        sh("sh", "-c", "dmesg | grep -i -E 'rds|rxe|rdma' | tail -15", check=False)
        down()
    ok = bool(results) and all(results)
    print(f"guest_socket_ib: {'PASS' if ok else 'FAIL'} ({sum(results)}/{len(results)} checks)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
