"""RDS/IB conformance: round trips, ordering, congestion and the info tables between two nodes over rdma_rxe
(:mod:`pyrds.testing.ib`: kernel-kernel, userspace-kernel, userspace-userspace on one machine;
kernel-userspace against a peer guest, a skip without one: one machine cannot host it).

These scenarios run only with ``--rds-ib`` (a pytest session of their own, after the main suite: they build
an rxe device in the initial namespace and unload rds_rdma for the userspace-userspace pairing). Every socket
is pinned with SO_RDS_TRANSPORT=IB and has 4 MiB buffers. Node A sends first (it is the side that dials).
"""

from __future__ import annotations

import ipaddress
import random
import socket
from typing import Any

import pytest

from pyrds import info
from pyrds.constants import SOL_RDS, InfoConnectionFlag, InfoType, SockOpt, Transport
from pyrds.testing.helpers import send_until_enobufs, send_when_uncongested, sockaddr_in
from pyrds.testing.ib import HELLO_TIMEOUT, errno_name, v4_mapped

pytestmark = pytest.mark.rds_ib

SIZES = {"0B": 0, "1B": 1, "4096B": 4096, "4097B": 4097, "64KiB": 64 << 10, "1MiB": 1 << 20}
RECV_BUF = 2 << 20
#: messages each way in the ordering scenario, and their largest payload (up to 3 IB fragments)
ORDER_COUNT = 300
ORDER_MAX = 9000
#: the congestion scenario: B's SO_RCVBUF (doubled by the kernel; a port congests once more than half of that
#: is queued, rds_recv_rcvbuf_delta), A's message size, most messages A tries, how long each phase may take
CONG_RCVBUF, CONG_MSG, CONG_LIMIT, CONG_TIMEOUT = 4096, 1024, 400, 120.0


def _payload(n: int, salt: str) -> bytes:
    return random.Random(f"{salt}/{n}").randbytes(n)


def _differs(got: bytes, want: bytes) -> str:
    """Why ``got`` is not ``want``, without printing a megabyte."""
    if len(got) != len(want):
        return f"{len(got)} bytes instead of {len(want)}"
    first = next(i for i, (x, y) in enumerate(zip(got, want, strict=True)) if x != y)
    return f"{len(got)} bytes, first difference at offset {first}"


def _pair(rds_ib_pair: Any) -> tuple[Any, Any]:
    return rds_ib_pair.a.bound(), rds_ib_pair.b.bound()


def _ping_pong(a: Any, b: Any) -> None:
    """One message each way (the connection is up for these sockets' addresses before anything is read)."""
    a.sendto(b"ping", b.getsockname())
    assert b.recv(64) == b"ping"
    b.sendto(b"pong", a.getsockname())
    assert a.recv(64) == b"pong"


def _host(addr: Any) -> tuple[str, int]:
    """(address text, port) of a socket address (an IPv6 one carries flowinfo and scope id too)."""
    return str(ipaddress.ip_address(addr[0])), int(addr[1])


def _recv_or_dump(sock: Any, pair: Any, socks: tuple[Any, Any]) -> tuple[bytes, Any]:
    try:
        got: tuple[bytes, Any] = sock.recvfrom(RECV_BUF)
    except OSError:  # TimeoutError included
        pair.dump_state(socks)
        raise
    return got


def roundtrip(a: Any, b: Any, size: int, rds_observe: Any, salt: str = "", *, pair: Any) -> None:
    """A message of ``size`` bytes A->B, then another B->A, between sockets pinned to IB: SO_RDS_TRANSPORT of
    both (observed), payloads and source addresses (also used by test_ib_ipv6.py). A receive that fails
    (timeout, errno) prints both nodes' RDS/IB state first (``pair``: their IbPair)."""
    ta = a.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT)
    tb = b.getsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT)
    rds_observe("transport", (ta, tb))
    assert ta == tb == Transport.IB
    there, back = _payload(size, salt + "A->B"), _payload(size, salt + "B->A")
    assert a.sendto(there, b.getsockname()) == size
    got, src = _recv_or_dump(b, pair, (a, b))
    assert got == there, f"A->B: {_differs(got, there)}"
    assert _host(src) == _host(a.getsockname())
    assert b.sendto(back, a.getsockname()) == size
    got, src = _recv_or_dump(a, pair, (a, b))
    assert got == back, f"B->A: {_differs(got, back)}"
    assert _host(src) == _host(b.getsockname())


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_ib_roundtrip(rds_ib_pair, rds_observe, size):
    """A message of ``size`` bytes A->B, then another B->A: payload and source address intact."""
    a, b = _pair(rds_ib_pair)
    roundtrip(a, b, size, rds_observe, pair=rds_ib_pair)


def test_ib_ordering(rds_ib_pair, rds_observe):
    """Both nodes send ORDER_COUNT messages of 4 to ORDER_MAX + 4 bytes to each other at once, non-blocking,
    retrying on ENOBUFS (pyrds.testing.workloads.exchange): each side's running SHA-256 of what it sent
    equals the receiver's of what arrived, i.e. every message once, in order."""
    a, b = _pair(rds_ib_pair)
    na, nb = rds_ib_pair.a, rds_ib_pair.b
    kw = {"count": ORDER_COUNT, "max_size": ORDER_MAX, "timeout": 600.0, "stall": 90.0}
    ja = na.agent.job("pyrds.testing.workloads:exchange", [a], peers=[b.getsockname()], seed=1, **kw)
    jb = nb.agent.job("pyrds.testing.workloads:exchange", [b], peers=[a.getsockname()], seed=2, **kw)
    ra = na.agent.wait(ja, 700.0)
    rb = nb.agent.wait(jb, 700.0)
    ka, kb = ra["me"], rb["me"]
    print(f"A {ka}: {ra['elapsed_s']} s, refused {ra['refusals']}")
    print(f"B {kb}: {rb['elapsed_s']} s, refused {rb['refusals']}")
    rds_observe("received", (ra["recv_n"], rb["recv_n"]) == ({kb: ORDER_COUNT}, {ka: ORDER_COUNT}))
    assert ra["recv_n"] == {kb: ORDER_COUNT} and rb["recv_n"] == {ka: ORDER_COUNT}
    assert ra["sent"][kb] == rb["recv"][ka], "A->B: a message lost, duplicated, reordered or changed"
    assert rb["sent"][ka] == ra["recv"][kb], "B->A: a message lost, duplicated, reordered or changed"


def _flag_names(flags: int) -> str:
    return "connected" if flags & InfoConnectionFlag.CONNECTED else "not connected"


def test_ib_connections_info(rds_ib_pair, rds_observe):
    """RDS_INFO_CONNECTIONS on each node after a message each way: one row for the pair, transport
    "infiniband", connected."""
    a, b = _pair(rds_ib_pair)
    _ping_pong(a, b)
    views = []
    for node, sock, peer in ((rds_ib_pair.a, a, rds_ib_pair.b), (rds_ib_pair.b, b, rds_ib_pair.a)):
        rows = [
            r
            for r in sock.get_info(InfoType.RDS_INFO_CONNECTIONS)
            if str(r.laddr) == node.addr and str(r.faddr) == peer.addr
        ]
        views.append(f"{node.name}: " + ", ".join(f"{r.transport} {_flag_names(r.flags)}" for r in rows))
    rds_observe("rows", "; ".join(views))
    assert views == [f"{n}: infiniband connected" for n in "AB"]


def _ends(row: Any) -> tuple[str, str]:
    """The row's (source, destination) as IPv4 text (a v4-mapped IPv6 address of RDS6_* as its IPv4)."""
    out = []
    for addr in (row.src_addr, row.dst_addr):
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        out.append(str(addr))
    return out[0], out[1]


def _gids(row: Any, own: str, peer: str) -> str:
    if (row.src_gid, row.dst_gid) == (v4_mapped(own), v4_mapped(peer)):
        return "own/peer (v4-mapped)"
    return f"{row.src_gid.hex()}/{row.dst_gid.hex()}"


@pytest.mark.parametrize(
    "table", [InfoType.RDS_INFO_IB_CONNECTIONS, InfoType.RDS6_INFO_IB_CONNECTIONS], ids=["ipv4", "ipv6"]
)
def test_ib_rdma_connection_info(rds_ib_pair, rds_observe, table):
    """RDS_INFO_IB_CONNECTIONS / RDS6_INFO_IB_CONNECTIONS on each node after a message each way: one record
    for the pair (in the v6 table with v4-mapped addresses), in the uapi size, the GIDs of both ends swapped
    between the two nodes' records. Observed per node: record size, GIDs, ring sizes and max_send_sge, tos
    and sl, the MR pool figures, whether cache_allocs is zero."""
    a, b = _pair(rds_ib_pair)
    _ping_pong(a, b)
    found = {}
    for node, sock, peer in ((rds_ib_pair.a, a, rds_ib_pair.b), (rds_ib_pair.b, b, rds_ib_pair.a)):
        job = node.agent.job("pyrds.testing.ib:info_table", [sock], table=int(table))
        size, rows = node.agent.wait(job, 60.0)
        mine = [r for r in rows if _ends(r) == (node.addr, peer.addr)]
        found[node.name] = (size, mine, node.addr, peer.addr)
    counts = {n: len(mine) for n, (_s, mine, _o, _p) in found.items()}
    rds_observe("records", counts)
    assert counts == {"A": 1, "B": 1}, counts
    view: dict[str, list[str]] = {}
    for n, (size, mine, own, peer) in found.items():
        r = mine[0]
        print(f"{n} {own} -> {peer}: record size {size}, {r}")  # the figures behind the observations
        for key, value in (
            ("record_size", size),
            ("gids", _gids(r, own, peer)),
            ("rings", f"send_wr {r.max_send_wr} recv_wr {r.max_recv_wr} send_sge {r.max_send_sge}"),
            ("tos_sl", f"{r.tos}/{r.sl}"),
            ("mr_pool", f"rdma_mr_max {r.rdma_mr_max} rdma_mr_size {r.rdma_mr_size}"),
            ("cache_allocs", "0" if r.cache_allocs == 0 else "> 0"),
        ):
            view.setdefault(key, []).append(f"{n}: {value}")
    for key, values in view.items():
        rds_observe(key, "; ".join(values))
    assert found["A"][0] == found["B"][0] == info.record_size(table)
    ra, rb = found["A"][1][0], found["B"][1][0]
    assert (ra.src_gid, ra.dst_gid) == (rb.dst_gid, rb.src_gid), "the two records' GIDs are not swapped"


#: why userspace-kernel needs the peer guest here
ONE_MACHINE_NO_CONG = (
    "not run on one machine: the kernel marks its RDS/IB connection to a local address as loopback "
    "(c_loopback) and rds_ib_xmit sends no congestion map update on it ('Do not send cong updates to IB "
    "loopback'), so a userspace sender on the same machine never learns that the kernel's port is congested "
    "(seen on 7.3.4: no ENOBUFS after 400 messages); it runs across two guests (vm --peer-ib)"
)


def _cong_pair(rds_ib_pair: Any) -> Any:
    """userspace-kernel across the two guests (``IbPair.across_guests``), else a skip; other pairings as
    they are."""
    if rds_ib_pair.label != "userspace-kernel":
        return rds_ib_pair
    across = rds_ib_pair.across_guests()
    if across is None:
        pytest.skip(ONE_MACHINE_NO_CONG)
    return across


def test_ib_congestion(rds_ib_pair, rds_observe):
    """B's socket (SO_RCVBUF 4096) reads nothing while A sends 1 KiB messages non-blocking: A gets ENOBUFS
    once B's congestion map, sent over the IB connection, marks the port. B then reads every message, and A's
    next send goes through once the map that clears the port arrived (ENOBUFS retried meanwhile). Observed:
    that ENOBUFS came, that B got every message, that A recovered. userspace-kernel runs across the two guests
    (:data:`ONE_MACHINE_NO_CONG`)."""
    a, b = _pair(_cong_pair(rds_ib_pair))
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CONG_RCVBUF)
    _ping_pong(a, b)
    sent, enobufs = send_until_enobufs(a, b.getsockname(), CONG_MSG, CONG_TIMEOUT, CONG_LIMIT, pause=0.05)
    rds_observe("enobufs", enobufs)
    assert enobufs, f"no ENOBUFS after {sent} messages of {CONG_MSG} bytes"
    assert sent >= 2, sent
    b.settimeout(CONG_TIMEOUT)
    got = sum(1 for _ in range(sent) if len(b.recv(RECV_BUF)) == CONG_MSG)
    rds_observe("all_received", got == sent)
    assert got == sent, (got, sent)
    send_when_uncongested(a, b"again", b.getsockname(), CONG_TIMEOUT, pause=0.1)
    assert b.recv(64) == b"again"
    rds_observe("recovered", True)


#: the cancel scenario: node A's SO_SNDBUF (rds_sk_sndbuf is this much), the size of the messages that fill
#: it, how many it tries at most, the two destination ports, and the host number of an address of node A's /24
#: that nobody has (rdma_cm never reaches it: the messages stay in the connection's send queue)
CANCEL_SNDBUF, CANCEL_MSG, CANCEL_LIMIT = 16384, 4096, 64
CANCEL_PORT, OTHER_PORT, NOBODY = 4000, 4001, 200


def _nobody(node: Any) -> str:
    """An address next to ``node``'s own in its /24 that no node has."""
    return str(ipaddress.IPv4Network(f"{node.addr}/24", strict=False).network_address + NOBODY)


def _queued_to(sock: Any, faddr: str) -> list[int]:
    """The destination ports of the send queue's rows toward ``faddr``, sorted. From RDS6_INFO_SEND_MESSAGES
    (v4-mapped addresses): the IPv4 table gives every row laddr and faddr 0.0.0.0 on the kernels
    (docs/kernel-vs-facts.md row 22), which made this scenario see no kernel rows at all until 2026-12-04."""
    mapped = ipaddress.IPv6Address(f"::ffff:{faddr}")
    return sorted(r.fport for r in sock.get_info(InfoType.RDS6_INFO_SEND_MESSAGES) if r.faddr == mapped)


def _fill(a: Any, dest: tuple[str, int]) -> tuple[int, str]:
    """Non-blocking sends of CANCEL_MSG bytes to ``dest`` until one is refused: (sent, refusal errno). The
    socket is non-blocking meanwhile (timeout 0): with a timeout, the stdlib's send first waits for POLLOUT
    until the deadline, MSG_DONTWAIT or not, and a full buffer then cost the whole timeout (60 s per pairing);
    afterwards it has the timeout every node socket has (``bound``)."""
    data = bytes(CANCEL_MSG)
    a.settimeout(0)
    try:
        for sent in range(CANCEL_LIMIT):
            try:
                a.sendto(data, socket.MSG_DONTWAIT, dest)
            except OSError as exc:
                return sent, errno_name(exc)
        return CANCEL_LIMIT, "none"
    finally:
        a.settimeout(HELLO_TIMEOUT)


def test_ib_cancel_sent_to(rds_ib_pair, rds_observe):
    """RDS_CANCEL_SENT_TO (``rds_send_drop_to``) over RDS/IB. Node A's socket (SO_SNDBUF CANCEL_SNDBUF) sends
    a small message to an address nobody has on port OTHER_PORT, then CANCEL_MSG-byte messages to the same
    address on CANCEL_PORT until its send buffer refuses one (the connection is never made: they all stay in
    its send queue, which RDS6_INFO_SEND_MESSAGES lists). Cancelling CANCEL_PORT takes those rows out of the
    table and frees their bytes (the refused send now goes through), and leaves the OTHER_PORT message queued;
    cancelling that too empties the table. Then, to node B (reachable): a message delivered before the cancel
    stays delivered and the next one arrives after it. Observed: how many fit, the refusal's errno, the ports
    listed before and after each cancel, whether the send after the cancel went through, what B received."""
    a, b = _pair(rds_ib_pair)
    nobody = _nobody(rds_ib_pair.a)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CANCEL_SNDBUF)
    a.sendto(b"other", socket.MSG_DONTWAIT, (nobody, OTHER_PORT))
    sent, refusal = _fill(a, (nobody, CANCEL_PORT))
    rds_observe("filled", (sent, refusal))
    assert sent >= 1 and refusal == "EAGAIN", (sent, refusal)
    before = _queued_to(a, nobody)
    rds_observe("listed_before", before)
    assert before == [CANCEL_PORT] * sent + [OTHER_PORT], (sent, before)
    a.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr_in(nobody, CANCEL_PORT))
    after = _queued_to(a, nobody)
    rds_observe("listed_after_cancel", after)
    assert CANCEL_PORT not in after and after == [p for p in before if p == OTHER_PORT], (before, after)
    again = a.sendto(bytes(CANCEL_MSG), socket.MSG_DONTWAIT, (nobody, CANCEL_PORT))
    rds_observe("send_after_cancel", again)
    assert again == CANCEL_MSG
    a.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr_in(nobody, CANCEL_PORT))
    a.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr_in(nobody, OTHER_PORT))
    left = _queued_to(a, nobody)
    rds_observe("listed_at_end", left)
    assert left == []
    host, port = _host(b.getsockname())
    a.sendto(b"delivered", (host, port))
    first = b.recv(64)
    a.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr_in(host, port))
    a.sendto(b"after", (host, port))
    got = [first, b.recv(64)]
    rds_observe("received", got)
    assert got == [b"delivered", b"after"], got
