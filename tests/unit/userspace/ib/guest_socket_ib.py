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

Then, side by side (kernel | userspace): the transport an *unpinned* socket gets when bound to an RDMA
address (and to the address without one), with a message each way between two unpinned sockets; which
RDS_INFO types each answers; RDS_INFO_IB_CONNECTIONS and RDS6_INFO_IB_CONNECTIONS (record size, every
field: the kernel's row for K->U against ours for U->K); RDS_INFO_COUNTERS (the ib_* names and values).
rds_tcp is not loaded here, so the kernel has no TCP tables or counters (the userspace stack always has TCP).
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
from pyrds import info  # noqa: E402
from pyrds.constants import SOL_RDS, InfoType, SockOpt  # noqa: E402
from pyrds.userspace import rpc  # noqa: E402
from pyrds.userspace.stack.counters import IB_NAMES  # noqa: E402

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


def transport_after_bind(s: Any, addr: tuple[str, int]) -> str:
    e = bind_errno(s, addr)
    if e:
        return errno.errorcode.get(e, str(e))
    return str(s.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT))


def unpinned_checks(results: list[bool]) -> None:
    """rds_trans_get_preferred: an unpinned socket bound to an RDMA device's address gets IB (0)."""
    socks: list[Any] = []
    try:
        got = {}
        for backend in ("kernel", "userspace"):
            a = socket.socket(AF_RDS, socket.SOCK_SEQPACKET) if backend == "kernel" else pyrds.socket(backend)
            b = socket.socket(AF_RDS, socket.SOCK_SEQPACKET) if backend == "kernel" else pyrds.socket(backend)
            socks += [a, b]
            ip = K_IP if backend == "kernel" else U_IP
            before = a.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT)
            got[backend] = (
                before,
                transport_after_bind(a, (ip, 4400)),
                transport_after_bind(b, (NODEV_IP, 4401)),
            )
            print(
                f"  {backend}: unpinned SO_RDS_TRANSPORT before bind {before}, after bind to {ip} (rxe) "
                f"{got[backend][1]}, bind to {NODEV_IP} (no RDMA device) {got[backend][2]}",
                flush=True,
            )
        check(
            got["kernel"][:2] == got["userspace"][:2] == (-1, "0"),
            "unpinned socket on an RDMA address: IB on both",
            results,
        )
        ka, ua = socks[0], socks[2]
        ka.settimeout(TIMEOUT)
        ua.settimeout(TIMEOUT)
        ua.sendto(b"unpinned u->k", (K_IP, 4400))
        data, addr = ka.recvfrom(BUF)
        ka.sendto(b"unpinned k->u", (U_IP, 4400))
        data2, addr2 = ua.recvfrom(BUF)
        check(
            (data, tuple(addr)[:2], data2, tuple(addr2)[:2])
            == (b"unpinned u->k", (U_IP, 4400), b"unpinned k->u", (K_IP, 4400)),
            f"unpinned sockets exchange: kernel got {data!r} from {addr}, userspace {data2!r} from {addr2}",
            results,
        )
    finally:
        for x in socks:
            x.close()


def probe_types(s: Any) -> dict[int, str]:
    out = {}
    for t in range(10000, 10018):
        try:
            s.get_info(t)
            out[t] = "ok"
        except (OSError, ValueError) as exc:
            out[t] = errno.errorcode.get(getattr(exc, "errno", 0) or 0, type(exc).__name__)
    return out


def table(ks: Any, us: Any, t: InfoType) -> tuple[int, bytes, bytes]:
    each, kraw = ks.get_info_raw(t)
    uraw = us._call(rpc.Op.INFO, (int(t),))
    return each, kraw, uraw


def info_checks(ks: Any, us: Any, results: list[bool]) -> None:
    kt, ut = probe_types(ks), probe_types(us)
    for t in range(10000, 10018):
        name = InfoType(t).name if t in InfoType._value2member_map_ else str(t)
        print(f"  {name:32} kernel {kt[t]:12} userspace {ut[t]}", flush=True)
    kset = {t for t, v in kt.items() if v == "ok"}
    uset = {t for t, v in ut.items() if v == "ok"}
    tcp = {int(InfoType.RDS_INFO_TCP_SOCKETS), int(InfoType.RDS6_INFO_TCP_SOCKETS)}
    check(
        kset - tcp == uset - tcp and {10008, 10017} <= uset,
        f"same RDS_INFO types answered but TCP's (no rds_tcp): kernel {len(kset)}, userspace {len(uset)}",
        results,
    )
    for t in (InfoType.RDS_INFO_IB_CONNECTIONS, InfoType.RDS6_INFO_IB_CONNECTIONS):
        each, kraw, uraw = table(ks, us, t)
        size = info.record_size(t)
        krows, urows = info.parse_info(t, kraw), info.parse_info(t, uraw)
        print(
            f"  {t.name}: kernel record size {each}, {len(kraw)} B, {len(krows)} rows; userspace "
            f"{len(uraw)} B, {len(urows)} rows (struct size {size})",
            flush=True,
        )
        for who, rows in (("kernel", krows), ("userspace", urows)):
            for r in rows:
                print(
                    f"    {who}: {r.src_addr} -> {r.dst_addr} src_gid {r.src_gid.hex()} "
                    f"dst_gid {r.dst_gid.hex()} "
                    f"max_send_wr {r.max_send_wr} max_recv_wr {r.max_recv_wr} max_send_sge {r.max_send_sge} "
                    f"rdma_mr_max {r.rdma_mr_max} rdma_mr_size {r.rdma_mr_size} tos {r.tos} sl {r.sl} "
                    f"cache_allocs {r.cache_allocs}",
                    flush=True,
                )
        ends = ({K_IP, f"::ffff:{K_IP}"}, {U_IP, f"::ffff:{U_IP}"})

        def mine(r: Any, src: set[str], dst: set[str]) -> bool:
            return (
                str(r.src_addr) in src
                and str(r.dst_addr) in dst
                or (
                    r.src_addr.version == 6
                    and str(r.src_addr.ipv4_mapped) in src
                    and str(r.dst_addr.ipv4_mapped) in dst
                )
            )

        k = [r for r in krows if mine(r, ends[0], ends[1])]
        u = [r for r in urows if mine(r, ends[1], ends[0])]
        check(
            len(uraw) == len(urows) * size and (not kraw or each == size),
            f"{t.name}: record size {size}",
            results,
        )
        check(
            bool(k) == bool(u),
            f"{t.name}: K<->U connection listed by kernel {bool(k)}, userspace {bool(u)}",
            results,
        )
        if k and u:
            kr, ur = k[0], u[0]
            same = (kr.src_gid, kr.dst_gid) == (ur.dst_gid, ur.src_gid) and (
                kr.max_send_wr,
                kr.max_recv_wr,
                kr.max_send_sge,
                kr.tos,
                kr.sl,
            ) == (ur.max_send_wr, ur.max_recv_wr, ur.max_send_sge, ur.tos, ur.sl)
            check(same, f"{t.name}: GIDs (swapped), ring sizes, max_send_sge, tos, sl agree", results)
    kc = [(r.name, r.value) for r in ks.get_info(InfoType.RDS_INFO_COUNTERS)]
    uc = [(r.name, r.value) for r in us.get_info(InfoType.RDS_INFO_COUNTERS)]
    kib = [n for n, _ in kc if n.startswith("ib_")]
    uib = [n for n, _ in uc if n.startswith("ib_")]
    print(f"  RDS_INFO_COUNTERS: kernel {len(kc)} rows, userspace {len(uc)} rows", flush=True)
    kd, ud = dict(kc), dict(uc)
    for n in sorted(set(kib) | set(uib), key=lambda n: (kib + uib).index(n)):
        print(f"    {n:32} kernel {kd.get(n, '-'):>10} userspace {ud.get(n, '-'):>10}", flush=True)
    for n in ("send_ack_required", "recv_ack_required", "recv_delivered", "send_queued"):
        print(f"    {n:32} kernel {kd.get(n, '-'):>10} userspace {ud.get(n, '-'):>10}", flush=True)
    check(
        kib == uib == list(IB_NAMES),
        f"ib_* counter names and order: kernel {len(kib)}, userspace {len(uib)}",
        results,
    )
    knames, unames = [n for n, _ in kc], [n for n, _ in uc]
    check(
        unames[: len(knames)] == knames,
        "userspace counter names start with the kernel's (then TCP's)",
        results,
    )


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
        unpinned_checks(results)
        kinfo = pyrds.socket("kernel")
        try:
            info_checks(kinfo, us, results)
        finally:
            kinfo.close()
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
