"""Guest test: a userspace RDS/IB receiver over its receive cap holds the connection on real rdma_rxe (not a
pytest module: run it in a QEMU guest; rds_rdma must not be loaded, it would own rdma_cm port 18634)::

    python -m vm run --kernel 7.3 --timeout 600 --modules rdma_rxe,ib_uverbs,rdma_ucm,dummy \\
        -- python tests/unit/userspace/ib/guest_hold_ib.py

Two in-process stacks (``Stack`` + ``IbTransport`` over pyverbs) on one dummy netdev with one rxe device
(guest_smoke_ib.py's topology), small rings (send 8, receive 16) and a receive cap of HOLD_CAP charged bytes
(``stack.core.recv_cap`` replaced, so that a few dozen messages cross it). A queues COUNT messages of SIZE
bytes to B's socket, which does not read. Checked: B stops at the cap plus at most the ring's frames, its
connection is held (``rx_holds``), both connections stay UP while A's sends wait in RC's RNR retries (A still
holds unacked messages); then B reads its queue down and every message arrives, in order, exactly once,
and the hold is released. The fake-fabric unit tests (test_ib_transport.py) check the same logic; this one
checks that rxe's RNR NAK / retry keeps the connection alive with an empty receive ring.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from guest_smoke_ib import Loop, Topo, lsmod, payload, sh  # noqa: E402

HOLD_CAP = 20_000
COUNT, SIZE = 100, 1000  # 100,000 bytes: within the default send buffer (rds_sndbuf 106,496)
RINGS = {"send_wr": 8, "recv_wr": 16}


def main() -> int:
    from pyrds.constants import SOL_RDS, SockOpt
    from pyrds.constants import Transport as TransportType
    from pyrds.userspace.config import StackConfig
    from pyrds.userspace.stack import core
    from pyrds.userspace.stack.errors import StackError
    from pyrds.userspace.stack.resources import RECV_MSG_OVERHEAD
    from pyrds.userspace.stack.sockopts import setsockopt
    from pyrds.userspace.stack.sockstate import SockState
    from pyrds.userspace.transports import loop_transport
    from pyrds.userspace.transports.ib.pyverbs_backend import PyverbsVerbs
    from pyrds.userspace.transports.ib.transport import IbTransport

    print(f"kernel {os.uname().release}", flush=True)
    if "rds_rdma" in lsmod():
        sh("modprobe", "-r", "rds_rdma", check=False)
    core.recv_cap = lambda rcvbuf: HOLD_CAP  # type: ignore[assignment]
    topo = Topo("dummy")
    a_ip, b_ip = topo.up()
    ok = False
    try:
        loop = Loop()
        verbs = PyverbsVerbs()

        def stack() -> tuple[core.Stack, IbTransport]:
            s = core.Stack(StackConfig(initial_netns=True))
            s.attach(loop_transport(s))
            ib = IbTransport(s, loop, verbs, engine_kwargs=RINGS)
            ib.start()
            s.attach(ib)
            return s, ib

        def ib_socket(s: core.Stack, addr: str, port: int) -> SockState:
            rs = s.open()
            setsockopt(s, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.IB))
            s.bind(rs, ipaddress.ip_address(addr), port, 0)
            return rs

        a, ib_a = stack()
        b, ib_b = stack()
        sa = ib_socket(a, a_ip, 4000)
        sb = ib_socket(b, b_ip, 5000)
        for i in range(COUNT):
            a.sendmsg(sa, payload(SIZE, i), [], 0, (ipaddress.ip_address(b_ip), 5000), True)
        t0 = time.monotonic()
        loop.run_until(lambda: False, 8.0)  # B's queue fills to its cap, then A's sends meet no buffer
        node_b = ib_b.nodes[ipaddress.ip_address(b_ip)]
        conn_b = node_b.conns.get(ipaddress.ip_address(a_ip))
        conn_a = ib_a.nodes[ipaddress.ip_address(a_ip)].conns.get(ipaddress.ip_address(b_ip))
        held = len(sb.recv_queue)
        limit = HOLD_CAP // (SIZE + RECV_MSG_OVERHEAD) + 1 + RINGS["recv_wr"]
        print(
            f"after 8 s: B queued {held} of {COUNT} (limit {limit}); B's connection {conn_b!r} holds "
            f"{conn_b.rx_holds if conn_b else None}; A's connection {conn_a!r}; A's unacked {len(sa.sent)}",
            flush=True,
        )
        ok_held = (
            conn_b is not None
            and conn_a is not None
            and conn_b.rx_holds == {(ipaddress.ip_address(b_ip), 5000)}
            and HOLD_CAP // (SIZE + RECV_MSG_OVERHEAD) <= held <= limit
            and conn_b.state.value == "up"
            and conn_a.state.value == "up"
            and len(sa.sent) > 0
        )
        got: list[bytes] = []
        deadline = time.monotonic() + 120
        while len(got) < COUNT and time.monotonic() < deadline:
            while True:
                try:
                    data, _anc, _flags, _addr = b.recvmsg(sb, 1 << 16, 0, 0, True)
                except StackError as exc:
                    assert exc.code == errno.EAGAIN
                    break
                got.append(data)
            loop.run_until(lambda: bool(sb.recv_queue), 2.0)
        loop.run_until(lambda: not sa.sent, 20.0)
        t1 = time.monotonic()
        ok_all = got == [payload(SIZE, i) for i in range(COUNT)]
        hold_counters = {k: v for k, v in conn_b.counters.items() if "hold" in k} if conn_b else {}
        print(
            f"read back {len(got)} in {t1 - t0:.1f} s, intact and in order: {ok_all}; B's holds "
            f"{conn_b.rx_holds if conn_b else None}; A's unacked {len(sa.sent)}; B counters "
            f"recv_cap_hold={b.counters['recv_cap_hold']} ib_recv_over_cap={b.counters['ib_recv_over_cap']}; "
            f"B's hold counters {hold_counters}; "
            f"closed: A {ib_a.nodes[ipaddress.ip_address(a_ip)].closed} B {node_b.closed}",
            flush=True,
        )
        ok = bool(ok_held and ok_all and conn_b is not None and not conn_b.rx_holds and not sa.sent)
        ok = ok and not node_b.closed  # the connection never dropped
        ib_a.close()
        ib_b.close()
    finally:
        topo.down()
    print(f"guest_hold_ib: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
