"""Guest smoke test of the userspace RDS/IB driver on rdma_rxe (not a pytest module: run it in a QEMU guest).

    python -m vm run --kernel 7.3 --cpus 1 --timeout 600 \\
        --modules rds,rdma_rxe,ib_uverbs,rdma_ucm,veth,dummy \\
        -- python tests/unit/userspace/ib/guest_smoke_ib.py [--mode userspace|kernel] [--topo dummy|veth]

Modes (each in the initial namespace, each builds and removes its own links and rxe devices):

- ``userspace`` (the milestone): rds_rdma must NOT be loaded. Two userspace endpoints (``IbNode``, pyverbs
  backend), A active-only and B listening on 18634, exchange messages of 1 B, 4097 B and 64 KiB each way.
  ``--topo dummy``: one dummy netdev holding both addresses and one rxe device (rxe loops the traffic back
  inside the device); ``--topo veth``: a veth pair in the same namespace, one address and one rxe device on
  each end -- seen failing on 7.3 (rdma_resolve_addr ends in ADDR_ERROR: both addresses are local, so the
  route to the peer is via ``lo``, not the veth). ``--bulk N`` then sends N messages each way at once.
- ``kernel``: loads rds_rdma; a kernel AF_RDS socket with SO_RDS_TRANSPORT=IB bound to address K, the
  userspace endpoint (active only: the kernel listens on 18634) on address U, one dummy netdev and rxe
  device holding both. The same three sizes go to the kernel socket and back.

Prints what it did and exits 0 only if every message arrived intact (and, userspace mode, was acked).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import logging
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

SIZES = [1, 4097, 64 * 1024]
SPORT_A, PORT_B = 4000, 5000


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = (r.stdout + r.stderr).strip()
    print(f"$ {' '.join(cmd)} -> {r.returncode}{(': ' + out) if out else ''}", flush=True)
    if check and r.returncode != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}")
    return r


def payload(n: int, salt: int) -> bytes:
    return bytes((i * 31 + salt) & 0xFF for i in range(n))


class Loop:
    """A selectors loop implementing the driver's FdLoop."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.wakeups = 0

    def add_reader(self, fd: int, cb: Callable[[], None]) -> None:
        self.sel.register(fd, selectors.EVENT_READ, cb)

    def remove_reader(self, fd: int) -> None:
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass

    def call_later(self, delay: float, cb: Callable[[], None]) -> None:
        heapq.heappush(self.timers, (time.monotonic() + delay, next(self.seq), cb))

    def run_until(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            now = time.monotonic()
            if now >= deadline:
                return False
            wait = deadline - now
            if self.timers:
                wait = max(0.0, min(wait, self.timers[0][0] - now))
            for key, _ in self.sel.select(min(wait, 1.0)):
                self.wakeups += 1
                key.data()
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                heapq.heappop(self.timers)[2]()
        return True


def lsmod() -> set[str]:
    with open("/proc/modules") as f:
        return {line.split()[0] for line in f}


# -- topologies ------------------------------------------------------------------------------------------
class Topo:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.links: list[str] = []
        self.rxes: list[str] = []

    def up(self) -> tuple[str, str]:
        if self.kind == "dummy":
            sh("ip", "link", "add", "ibsm0", "type", "dummy")
            self.links.append("ibsm0")
            sh("ip", "addr", "add", "10.77.0.1/24", "dev", "ibsm0")
            sh("ip", "addr", "add", "10.77.0.2/24", "dev", "ibsm0")
            sh("ip", "link", "set", "ibsm0", "up")
            sh("rdma", "link", "add", "ibsmrxe0", "type", "rxe", "netdev", "ibsm0")
            self.rxes.append("ibsmrxe0")
        else:
            sh("ip", "link", "add", "ibsmv0", "type", "veth", "peer", "name", "ibsmv1")
            self.links.append("ibsmv0")
            sh("ip", "addr", "add", "10.77.0.1/24", "dev", "ibsmv0")
            sh("ip", "addr", "add", "10.77.0.2/24", "dev", "ibsmv1")
            sh("ip", "link", "set", "ibsmv0", "up")
            sh("ip", "link", "set", "ibsmv1", "up")
            for dev in ("ibsmv0", "ibsmv1"):
                sh("rdma", "link", "add", f"rxe_{dev}", "type", "rxe", "netdev", dev)
                self.rxes.append(f"rxe_{dev}")
        time.sleep(0.5)  # GID table population is asynchronous
        sh("rdma", "link", "show", check=False)
        sh("ls", "-l", "/dev/infiniband", check=False)
        return "10.77.0.1", "10.77.0.2"

    def down(self) -> None:
        for rxe in self.rxes:
            sh("rdma", "link", "delete", rxe, check=False)
        for link in self.links:
            sh("ip", "link", "del", link, check=False)


# -- modes -----------------------------------------------------------------------------------------------
def report_node(name: str, node: Any) -> None:
    print(f"[{name}] counters {dict(node.counters)}; closed {[(str(p), r) for p, r in node.closed]}")
    for peer, conn in node.conns.items():
        print(f"[{name}] conn to {peer}: {conn!r} counters {dict(conn.counters)}")
    for peer, eng in node.engines.items():
        print(
            f"[{name}] engine to {peer}: state {eng.state.name} version {eng.version:#x} "
            f"queued {eng.path.queued_msgs} counters {dict(eng.counters)}"
        )


BULK_SIZES = [64 * 1024, 64 * 1024, 4097, 1]


def run_bulk(
    loop: Loop, a: Any, b: Any, a_ip: str, b_ip: str, got: dict[str, list[Any]], n: int, timeout: float
) -> bool:
    """``n`` messages each way at once (more fragments than either ring holds): all arrive, in order."""
    base_a, base_b = len(got["B"]), len(got["A"])
    want = [payload(BULK_SIZES[i % len(BULK_SIZES)], 100 + i) for i in range(n)]
    t0 = time.monotonic()
    for data in want:
        a.send(b_ip, SPORT_A, PORT_B, data)
        b.send(a_ip, PORT_B, SPORT_A, data[::-1])
    ea, eb = a.engine(b_ip), b.engine(a_ip)
    done = loop.run_until(lambda: len(got["B"]) - base_a >= n and len(got["A"]) - base_b >= n, timeout)
    dt = time.monotonic() - t0
    nbytes = sum(map(len, want))
    frags = sum(max(1, -(-len(d) // 4096)) for d in want)
    print(
        f"bulk: {n} messages ({nbytes} bytes, {frags} fragments) each way delivered in {dt:.2f} s; "
        f"B got {len(got['B']) - base_a}, A got {len(got['A']) - base_b}; loop wakeups {loop.wakeups}"
    )
    # what is still unacked stays so until the peer sends again: only every 9th message asks for an ACK
    # (send.c max_unacked_packets), as between kernels
    loop.run_until(lambda: ea.path.queued_msgs == 0 and eb.path.queued_msgs == 0, 5)
    print(f"bulk: still unacked after 5 s: A {ea.path.queued_msgs}, B {eb.path.queued_msgs}")
    ok = done and [m.payload for m in got["B"][base_a:]] == want
    ok = ok and [m.payload for m in got["A"][base_b:]] == [d[::-1] for d in want]
    report_node("A", a)
    report_node("B", b)
    print(f"bulk: {'ok' if ok else 'FAILED'}")
    return bool(ok)


def mode_userspace(topo: str, timeout: float, bulk: int = 0) -> bool:
    loaded = lsmod()
    print(f"rds_rdma loaded: {'rds_rdma' in loaded}; rdma_rxe: {'rdma_rxe' in loaded}", flush=True)
    if "rds_rdma" in loaded:
        sh("modprobe", "-r", "rds_rdma", check=False)
        if "rds_rdma" in lsmod():
            print("FAIL: rds_rdma is loaded and cannot be removed (its listener owns 18634)")
            return False
    from pyrds.userspace.proto import MessageReceived
    from pyrds.userspace.transports.ib.node import IbNode
    from pyrds.userspace.transports.ib.pyverbs_backend import PyverbsVerbs

    t = Topo(topo)
    a_ip, b_ip = t.up()
    ok = False
    try:
        verbs = PyverbsVerbs()
        loop = Loop()
        got: dict[str, list[Any]] = {"A": [], "B": []}

        def sink(name: str) -> Callable[[Any, list[Any]], None]:
            return lambda peer, events: got[name].extend(e for e in events if isinstance(e, MessageReceived))

        a = IbNode(verbs, loop, a_ip, on_events=sink("A"), listen=False)
        b = IbNode(verbs, loop, b_ip, on_events=sink("B"), listen=True)
        b.start()
        a.start()
        print(f"B listening on {b_ip}:18634; A ({a_ip}) sends {SIZES} to B", flush=True)
        t0 = time.monotonic()
        seqs = [a.send(b_ip, SPORT_A, PORT_B, payload(n, i)) for i, n in enumerate(SIZES)]
        eng_a = a.engine(b_ip)
        arrived = loop.run_until(lambda: len(got["B"]) >= len(SIZES) and eng_a.path.queued_msgs == 0, timeout)
        t1 = time.monotonic()
        print(f"A->B: {len(got['B'])} messages in {t1 - t0:.2f} s; A's queue {eng_a.path.queued_msgs}")
        ok_ab = arrived and [
            (m.header.sequence, m.header.sport, m.header.dport, m.payload) for m in got["B"]
        ] == [(s, SPORT_A, PORT_B, payload(n, i)) for s, (i, n) in zip(seqs, enumerate(SIZES), strict=True)]
        for m in got["B"]:
            print(
                f"  B got seq {m.header.sequence} {m.header.sport}->{m.header.dport} len {len(m.payload)} "
                f"flags {m.header.flags:#x}"
            )
        # and back: B answers each message with its payload reversed
        seqs_b = [b.send(a_ip, PORT_B, SPORT_A, m.payload[::-1]) for m in got["B"]]
        eng_b = b.engine(a_ip)
        back = loop.run_until(lambda: len(got["A"]) >= len(seqs_b) and eng_b.path.queued_msgs == 0, timeout)
        t2 = time.monotonic()
        print(f"B->A: {len(got['A'])} messages in {t2 - t1:.2f} s; B's queue {eng_b.path.queued_msgs}")
        ok_ba = back and [m.payload for m in got["A"]] == [payload(n, i)[::-1] for i, n in enumerate(SIZES)]
        for m in got["A"]:
            print(f"  A got seq {m.header.sequence} {m.header.sport}->{m.header.dport} len {len(m.payload)}")
        print(f"loop wakeups: {loop.wakeups}")
        report_node("A", a)
        report_node("B", b)
        ok = bool(ok_ab and ok_ba)
        if bulk:
            ok = run_bulk(loop, a, b, a_ip, b_ip, got, bulk, timeout) and ok
        # a peer disconnect: B closes its connection; A must see it and go DOWN without an exception
        cb = b.connection(a_ip)
        ca = a.connection(b_ip)
        if cb is not None and ca is not None:
            cb.close("smoke: B hangs up")
            # A redials at once if it still holds unacked messages: then a new connection comes up
            gone = loop.run_until(lambda: ca.close_reason != "", 20)
            print(
                f"after B hung up: A's connection {ca!r} ended: {ca.close_reason!r}; A's {dict(a.counters)}"
            )
            ok = ok and gone and ca.close_reason == "disconnected"
            loop.run_until(lambda: False, 2)
            print(f"then: A's connection {a.connection(b_ip)!r}, B's {b.connection(a_ip)!r}")
        a.close()
        b.close()
    finally:
        t.down()
    print(f"userspace/{topo}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def mode_kernel(timeout: float) -> bool:
    from pyrds.userspace.proto import MessageReceived
    from pyrds.userspace.transports.ib.node import IbNode
    from pyrds.userspace.transports.ib.pyverbs_backend import PyverbsVerbs

    sh("modprobe", "rds_rdma")
    t = Topo("dummy")
    k_ip, u_ip = t.up()
    ok = False
    ks = None
    try:
        ks = socket.socket(21, socket.SOCK_SEQPACKET)  # AF_RDS
        ks.setsockopt(276, 8, 0)  # SOL_RDS, SO_RDS_TRANSPORT, RDS_TRANS_IB
        ks.bind((k_ip, PORT_B))
        ks.setblocking(False)
        verbs = PyverbsVerbs()
        loop = Loop()
        got_k: list[tuple[bytes, Any]] = []
        got_u: list[Any] = []

        def read_kernel() -> None:
            assert ks is not None
            while True:
                try:
                    got_k.append(ks.recvfrom(1 << 20))
                except BlockingIOError:
                    return

        loop.add_reader(ks.fileno(), read_kernel)
        u = IbNode(
            verbs,
            loop,
            u_ip,
            listen=False,
            on_events=lambda peer, evs: got_u.extend(e for e in evs if isinstance(e, MessageReceived)),
        )
        t0 = time.monotonic()
        for i, n in enumerate(SIZES):
            u.send(k_ip, SPORT_A, PORT_B, payload(n, i))
        eng = u.engine(k_ip)
        arrived = loop.run_until(lambda: len(got_k) >= len(SIZES), timeout)
        print(f"userspace->kernel: {len(got_k)} messages in {time.monotonic() - t0:.2f} s")
        for data, addr in got_k:
            print(f"  kernel socket got {len(data)} bytes from {addr}")
        ok_uk = arrived and [(d, a) for d, a in got_k] == [
            (payload(n, i), (u_ip, SPORT_A)) for i, n in enumerate(SIZES)
        ]
        for data, _ in got_k:
            ks.sendto(data[::-1], (u_ip, SPORT_A))
        back = loop.run_until(lambda: len(got_u) >= len(SIZES), timeout)
        loop.run_until(lambda: eng.path.queued_msgs == 0, 5)
        print(f"kernel->userspace: {len(got_u)} messages; userspace queue {eng.path.queued_msgs}")
        for m in got_u:
            h = m.header
            print(f"  userspace got seq {h.sequence} {h.sport}->{h.dport} len {len(m.payload)}")
        ok_ku = back and [m.payload for m in got_u] == [payload(n, i)[::-1] for i, n in enumerate(SIZES)]
        report_node("U", u)
        ok = bool(ok_uk and ok_ku)
        u.close()
        loop.run_until(lambda: False, 1)
    finally:
        if ks is not None:
            ks.close()
        sh("sh", "-c", "dmesg | grep -i -E 'rds|rxe|rdma' | tail -20", check=False)
        t.down()
    print(f"kernel: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["userspace", "kernel"], default="userspace")
    ap.add_argument("--topo", choices=["dummy", "veth"], default="dummy")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--debug", action="store_true")
    ap.add_argument("--bulk", type=int, default=0, help="userspace mode: then N messages each way at once")
    args = ap.parse_args()
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="%(asctime)s %(message)s")
    import pyrds

    print(
        f"pyrds from {pyrds.__file__}; python {sys.version.split()[0]}; kernel {os.uname().release}",
        flush=True,
    )
    if args.mode == "userspace":
        return 0 if mode_userspace(args.topo, args.timeout, args.bulk) else 1
    return 0 if mode_kernel(args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
