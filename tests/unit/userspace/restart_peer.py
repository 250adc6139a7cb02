"""Sender and receiver processes for ``test_restart_netns.py`` (run inside a network namespace).

``send SRC BASEPORT NSOCK DST DPORT COUNT GEN OUT``: NSOCK userspace RDS sockets bound to SRC:BASEPORT+i send
COUNT messages round-robin (blocking) to DST:DPORT; message j of socket i carries (GEN, i, j). Writes a JSON
report to OUT at the end or at the first error: per socket how many sends were reported successful, the
errno if one failed, and the pid of the stack service that served it; the sockets stay open until OUT.close
exists (a close drops unacked messages).

``recv ADDR PORT NSOCK COUNT GEN IDLE OUT``: one socket bound to ADDR:PORT receives until the last message
of each of the NSOCK sockets of a GEN sender of COUNT messages arrived, IDLE seconds passed without one, or
an error (its service died); the JSON report lists (gen, sock, index) of every message in arrival order.
``OUT.progress`` holds the number received so far, and ``OUT.pid`` the service pid as soon as the socket is
bound.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import pyrds
from pyrds.testing.workloads import RESTART_MSG, RESTART_PAD, restart_recv


def service_pid(sock: Any) -> int:
    cred = sock._ctl.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[:4], sys.byteorder)


def write_json(path: str, obj: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def send(src: str, baseport: int, nsock: int, dst: str, dport: int, count: int, gen: int, out: str) -> None:
    socks = []
    for i in range(nsock):
        s = pyrds.socket("userspace")
        # a send buffer of 32 messages (rds_sndbuf 2048): the sender is held by B's acks all along (the
        # default holds holds the whole transfer: sends that do not wait for the stack ended before the kill)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2048)
        s.bind((src, baseport + i))
        socks.append(s)
    report: dict[str, Any] = {"pid": service_pid(socks[0]), "sent": [0] * nsock, "error": None}
    write_json(out + ".pid", report["pid"])
    try:
        for j in range(count):
            i = j % nsock
            socks[i].sendto(RESTART_MSG.pack(gen, i, report["sent"][i]) + RESTART_PAD, (dst, dport))
            report["sent"][i] += 1
    except OSError as exc:
        report["error"] = exc.errno if exc.errno is not None else str(exc)
    report["end"] = time.time()
    write_json(out, report)
    # close() drops what is not acked yet (rds_send_drop_to, as in the kernel): keep the sockets open until
    # the test has seen the messages arrive (or 300 s)
    deadline = time.monotonic() + 300
    while not os.path.exists(out + ".close") and time.monotonic() < deadline:
        time.sleep(0.05)


def recv(addr: str, port: int, nsock: int, count: int, gen: int, idle: float, out: str) -> None:
    s = pyrds.socket("userspace")
    s.bind((addr, port))
    pid = service_pid(s)
    write_json(out + ".pid", pid)
    report: dict[str, Any] = {"pid": pid}
    report.update(restart_recv([s], nsock=nsock, count=count, gen=gen, idle=idle, progress=out + ".progress"))
    report["end"] = time.time()
    if report["error"] in (None, "idle"):
        from pyrds.constants import InfoType
        from pyrds.info import counters_dict

        report["counters"] = counters_dict(s.get_info(InfoType.RDS_INFO_COUNTERS))
    write_json(out, report)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "send":
        send(args[0], int(args[1]), int(args[2]), args[3], int(args[4]), int(args[5]), int(args[6]), args[7])
    else:
        recv(args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4]), float(args[5]), args[6])
