"""Guest test: RDMA cmsgs on ``pyrds.socket("userspace")`` sockets of RDS/IB over rdma_rxe (not a pytest
module: run it in a QEMU guest)::

    python -m vm run --kernel 7.3 --cpus 1 --timeout 1800 \\
        --modules rds,rdma_rxe,ib_uverbs,rdma_ucm,dummy \\
        -- python tests/unit/userspace/ib/guest_rdma_ib.py

One dummy netdev holds the addresses and one rxe device (guest_socket_ib.py explains why).

Phase 1, rds_rdma not loaded: two userspace stacks (two services, PYRDS_STACK_NAME A and B), socket A on
U1 and socket B on U2, both listening on rdma_cm 18634. B registers a buffer with RDS_CMSG_RDMA_MAP (cookie
written at its cookie address, offset = addr & 4095), A gets RDS_CMSG_RDMA_DEST; A does an RDMA WRITE
(NOTIFY_ME) of 64 KiB into it: B's buffer holds it when B gets the message, A gets RDS_CMSG_RDMA_STATUS
SUCCESS; B writes its buffer and names the MR again (RDMA_DEST), A READs it back; an offset into the MR;
USE_ONCE frees the MR on arrival (FREE_MR then EINVAL); GET_MR EOPNOTSUPP; a bad r_key: REMOTE_ERROR.

Phase 2, rds_rdma loaded (the kernel listens on 18634, the userspace node for U1 is active-only): a kernel
socket on K. Userspace as requester: K maps a buffer (RDMA_MAP in a message to U1), U1 WRITEs and READs it.
Userspace as target: U1 maps a buffer (our zero-based registration), K WRITEs into it with NOTIFY_ME.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.getcwd())

# the script's own directory is on sys.path: one logged shell helper for both guest scripts
from guest_socket_ib import sh  # noqa: E402

import pyrds  # noqa: E402
from pyrds import cmsg, uapi  # noqa: E402
from pyrds.constants import SOL_RDS, RdmaFlag, RdmaStatus, SockOpt  # noqa: E402

AF_RDS = 21
RDS_TRANS_IB = 0
K_IP, U1_IP, U2_IP = "10.79.0.1", "10.79.0.2", "10.79.0.3"
PA, PB, PK = 4100, 4200, 4300
RW, NOTIFY = RdmaFlag.READWRITE, RdmaFlag.NOTIFY_ME
TIMEOUT = 60.0
KEEP: list[Any] = []
RESULTS: list[bool] = []
LOGS: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    RESULTS.append(ok)


def page_buffer(size: int) -> int:
    mm = mmap.mmap(-1, size)
    buf = (ctypes.c_char * size).from_buffer(mm)
    KEEP.append((mm, buf))
    return ctypes.addressof(buf)


def iov(*vecs: tuple[int, int]) -> int:
    arr = (uapi.rds_iovec * len(vecs))()
    for i, (a, n) in enumerate(vecs):
        arr[i].addr, arr[i].bytes = a, n
    KEEP.append(arr)
    return ctypes.addressof(arr)


def errno_of(fn: Any) -> int:
    try:
        fn()
    except OSError as exc:
        return exc.errno or -1
    return 0


def recv(s: Any) -> tuple[bytes, list[Any]]:
    data, anc, _flags, _addr = s.recvmsg(1 << 20, 1024)
    return data, cmsg.parse_ancdata(anc)


STACKS: list[str] = []


def stop_stacks() -> None:
    """Stop the services this script started (before rds_rdma takes rdma_cm port 18634, and at the end)."""
    while STACKS:
        env = dict(os.environ, PYRDS_STACK_NAME=STACKS.pop())
        r = subprocess.run(
            [sys.executable, "-m", "pyrds", "stack", "stop"], env=env, capture_output=True, text=True
        )
        print(f"stack stop {env['PYRDS_STACK_NAME']}: {r.returncode} {r.stdout.strip()} {r.stderr.strip()}")


def user_socket(stack: str, ip: str, port: int) -> Any:
    if stack not in STACKS:
        STACKS.append(stack)
    os.environ["PYRDS_STACK_NAME"] = stack
    log = f"/tmp/{stack}.log"
    os.environ["PYRDS_STACK_LOG"] = log
    LOGS.append(log)
    s = pyrds.socket("userspace")
    s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, RDS_TRANS_IB)
    s.bind((ip, port))
    s.settimeout(TIMEOUT)
    return s


def kernel_socket(ip: str, port: int) -> Any:
    s = socket.socket(AF_RDS, socket.SOCK_SEQPACKET)
    s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, RDS_TRANS_IB)
    s.bind((ip, port))
    s.settimeout(TIMEOUT)
    return s


def map_from(owner: Any, peer: Any, peer_addr: tuple[str, int], addr: int, size: int, flags: int) -> int:
    """``owner`` registers [addr, addr+size) with RDMA_MAP in a message to ``peer``; the cookie."""
    cookie = ctypes.c_uint64(0)
    KEEP.append(cookie)
    owner.sendmsg([b"map"], [cmsg.rdma_map(addr, size, ctypes.addressof(cookie), flags)], 0, peer_addr)
    data, anc = recv(peer)
    check(
        data == b"map" and cookie.value != 0 and anc == [cmsg.RdmaDest(cookie.value)],
        f"RDMA_MAP: cookie {cookie.value:#x} at the cookie address, peer got {anc}",
    )
    check(cookie.value >> 32 == addr & 4095, "cookie offset = addr & 4095")
    return cookie.value


def phase_userspace(tag: str) -> None:
    a = user_socket(f"pyrds-rdma-a-{tag}", U1_IP, PA)
    b = user_socket(f"pyrds-rdma-b-{tag}", U2_IP, PB)
    try:
        a.sendto(b"hello", (U2_IP, PB))
        check(recv(b)[0] == b"hello", "A -> B over RDS/IB (two userspace stacks)")
        b.sendto(b"hello", (U1_IP, PA))
        check(recv(a)[0] == b"hello", "B -> A")
        size = 64 * 1024
        baddr, aaddr = page_buffer(size + 4096), page_buffer(size + 4096)
        cookie = map_from(b, a, (U1_IP, PA), baddr, size, RW)
        data = bytes((i * 13 + 7) & 0xFF for i in range(size))
        ctypes.memmove(aaddr, data, size)
        t0 = time.monotonic()
        a.sendmsg(
            [b"wrote"],
            [cmsg.rdma_args(cookie, 0, size, iov((aaddr, size)), 1, RW | NOTIFY, 77)],
            0,
            (U2_IP, PB),
        )
        got = recv(b)[0]
        dt = time.monotonic() - t0
        check(
            got == b"wrote" and ctypes.string_at(baddr, size) == data,
            f"RDMA WRITE 64 KiB visible at delivery ({dt:.2f} s)",
        )
        check(
            recv(a) == (b"", [cmsg.RdmaNotify(77, RdmaStatus.SUCCESS)]), "RDMA_STATUS SUCCESS to the writer"
        )
        ctypes.memmove(baddr, b"R" * 1000, 1000)
        b.sendmsg([b"again"], [cmsg.rdma_dest(cookie)], 0, (U1_IP, PA))
        check(recv(a) == (b"again", [cmsg.RdmaDest(cookie)]), "RDMA_DEST again (B's buffer synced)")
        ctypes.memset(aaddr, 0, size)
        a.sendmsg(
            [b"read"], [cmsg.rdma_args(cookie, 0, 1000, iov((aaddr, 1000)), 1, NOTIFY, 78)], 0, (U2_IP, PB)
        )
        check(recv(b)[0] == b"read", "READ's message delivered")
        check(recv(a) == (b"", [cmsg.RdmaNotify(78, RdmaStatus.SUCCESS)]), "RDMA_STATUS for the READ")
        check(ctypes.string_at(aaddr, 1010) == b"R" * 1000 + bytes(10), "RDMA READ: B's bytes in A's buffer")
        ctypes.memmove(aaddr, b"O" * 16, 16)
        a.sendmsg([b"off"], [cmsg.rdma_args(cookie, 100, 16, iov((aaddr, 16)), 1, RW)], 0, (U2_IP, PB))
        check(recv(b)[0] == b"off", "offset write delivered")
        check(ctypes.string_at(baddr + 96, 24) == b"R" * 4 + b"O" * 16 + b"R" * 4, "RDMA WRITE at offset 100")
        # USE_ONCE
        c2 = map_from(b, a, (U1_IP, PA), baddr, 4096, RW | RdmaFlag.USE_ONCE)
        a.sendmsg([b"once"], [cmsg.rdma_args(c2, 0, 8, iov((aaddr, 8)), 1, RW | NOTIFY, 5)], 0, (U2_IP, PB))
        check(recv(b)[0] == b"once", "USE_ONCE write delivered")
        check(recv(a)[1] == [cmsg.RdmaNotify(5, RdmaStatus.SUCCESS)], "USE_ONCE notification")
        free = uapi.rds_free_mr_args()
        free.cookie = c2
        e = errno_of(lambda: b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free)))
        check(e == errno.EINVAL, f"USE_ONCE MR gone on arrival: FREE_MR {errno.errorcode.get(e, e)}")
        free.cookie = cookie
        e = errno_of(lambda: b.setsockopt(SOL_RDS, SockOpt.RDS_FREE_MR, uapi.to_bytes(free)))
        check(e == 0, f"FREE_MR of the first MR: {e}")
        # GET_MR: no connection to post the registration on (FRWR): EOPNOTSUPP
        args = uapi.rds_get_mr_args()
        args.vec.addr, args.vec.bytes = aaddr, 4096
        e = errno_of(lambda: a.setsockopt(SOL_RDS, SockOpt.RDS_GET_MR, uapi.to_bytes(args)))
        check(e == errno.EOPNOTSUPP, f"RDS_GET_MR: {errno.errorcode.get(e, e)}")
        # the freed r_key: a remote access error on the wire
        a.sendmsg(
            [b"bad"], [cmsg.rdma_args(cookie, 0, 8, iov((aaddr, 8)), 1, RW | NOTIFY, 9)], 0, (U2_IP, PB)
        )
        check(recv(a)[1] == [cmsg.RdmaNotify(9, RdmaStatus.REMOTE_ERROR)], "freed r_key: REMOTE_ERROR")
    finally:
        a.close()
        b.close()


def phase_kernel(tag: str) -> None:
    u = user_socket(f"pyrds-rdma-u-{tag}", U1_IP, PA)
    k = kernel_socket(K_IP, PK)
    try:
        u.sendto(b"hello", (K_IP, PK))
        check(recv(k)[0] == b"hello", "userspace -> kernel over RDS/IB")
        k.sendto(b"hello", (U1_IP, PA))
        check(recv(u)[0] == b"hello", "kernel -> userspace")
        kaddr, uaddr = page_buffer(8192), page_buffer(8192)
        # userspace as requester into the kernel's FRWR MR
        cookie = map_from(k, u, (U1_IP, PA), kaddr, 4096, RW)
        ctypes.memmove(uaddr, b"W" * 4096, 4096)
        u.sendmsg(
            [b"wrote"],
            [cmsg.rdma_args(cookie, 0, 4096, iov((uaddr, 4096)), 1, RW | NOTIFY, 1)],
            0,
            (K_IP, PK),
        )
        check(recv(k)[0] == b"wrote", "kernel got the message")
        check(ctypes.string_at(kaddr, 4096) == b"W" * 4096, "userspace RDMA WRITE into the kernel's MR")
        check(recv(u)[1] == [cmsg.RdmaNotify(1, RdmaStatus.SUCCESS)], "notification")
        ctypes.memmove(kaddr, b"K" * 100, 100)
        ctypes.memset(uaddr, 0, 4096)
        u.sendmsg([b"read"], [cmsg.rdma_args(cookie, 0, 100, iov((uaddr, 100)), 1, NOTIFY, 2)], 0, (K_IP, PK))
        check(recv(k)[0] == b"read", "kernel got the READ's message")
        check(recv(u)[1] == [cmsg.RdmaNotify(2, RdmaStatus.SUCCESS)], "READ notification")
        check(ctypes.string_at(uaddr, 100) == b"K" * 100, "userspace RDMA READ of the kernel's MR")
        # the kernel as requester into our zero-based MR
        c2 = map_from(u, k, (K_IP, PK), uaddr, 4096, RW)
        ctypes.memmove(kaddr, b"Z" * 512, 512)
        k.sendmsg(
            [b"kw"], [cmsg.rdma_args(c2, 64, 512, iov((kaddr, 512)), 1, RW | NOTIFY, 3)], 0, (U1_IP, PA)
        )
        check(recv(u)[0] == b"kw", "userspace got the kernel's message")
        check(ctypes.string_at(uaddr + 64, 512) == b"Z" * 512, "kernel RDMA WRITE into the userspace MR")
        check(recv(k)[1] == [cmsg.RdmaNotify(3, RdmaStatus.SUCCESS)], "kernel's notification")
    finally:
        u.close()
        k.close()


def main() -> int:
    tag = uuid.uuid4().hex[:6]
    os.environ["PYRDS_LOG"] = "INFO"
    sh("ip", "link", "add", "rdm0", "type", "dummy")
    for ip in (K_IP, U1_IP, U2_IP):
        sh("ip", "addr", "add", f"{ip}/24", "dev", "rdm0")
    sh("ip", "link", "set", "rdm0", "up")
    sh("rdma", "link", "add", "rdmrxe0", "type", "rxe", "netdev", "rdm0")
    time.sleep(0.5)
    try:
        for name, phase in (("userspace-userspace", phase_userspace), ("userspace-kernel", phase_kernel)):
            print(f"--- {name}", flush=True)
            if phase is phase_kernel:
                stop_stacks()
                time.sleep(1)
                sh("modprobe", "rds_rdma")
            try:
                phase(tag)
            except Exception as exc:
                check(False, f"{name}: {type(exc).__name__}: {exc}")
    finally:
        stop_stacks()
        for log in LOGS:
            try:
                with open(log) as f:
                    print(f"--- {log}\n" + f.read().strip()[-3000:], flush=True)
            except OSError:
                pass
    print(f"{sum(RESULTS)}/{len(RESULTS)} checks passed", flush=True)
    return 0 if RESULTS and all(RESULTS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
