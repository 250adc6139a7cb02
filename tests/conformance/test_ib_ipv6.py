"""RDS/IB over IPv6: the same two nodes of one rxe device (:mod:`pyrds.testing.ib`), each with an IPv6 address
of the fabric's /64 beside its IPv4 one. An IPv6 RDS/IB connection is its own rdma_cm exchange: port 16385
(``RDS_CM_PORT``, the kernel's AF_INET6 listener) and the 56-byte ``rds6_ib_connect_private``, where IPv4 uses
port 18634 and 32 bytes (rdma_transport.c ``rds_rdma_listen_init``, ib_cm.c ``rds_ib_conn_path_connect``).

Runs with ``--rds-ib`` in the IB phase, like :mod:`tests.conformance.test_ib`; kernel-userspace is a skip
(two guests needed), as there.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from pyrds import info
from pyrds.constants import InfoType
from tests.conformance.test_ib import roundtrip

pytestmark = pytest.mark.rds_ib

SIZES = {"0B": 0, "4097B": 4097, "64KiB": 64 << 10}


def _pair6(rds_ib_pair: Any) -> tuple[Any, Any]:
    return rds_ib_pair.a.bound6(), rds_ib_pair.b.bound6()


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_ib_ipv6_roundtrip(rds_ib_pair, rds_observe, size):
    """A message of ``size`` bytes A->B over the nodes' IPv6 addresses, then another B->A: both sockets on
    RDS/IB, payload and source address intact (test_ib.roundtrip)."""
    a, b = _pair6(rds_ib_pair)
    roundtrip(a, b, size, rds_observe, salt="v6/", pair=rds_ib_pair)


def test_ib_ipv6_connection_info(rds_ib_pair, rds_observe):
    """After a message each way over IPv6: RDS6_INFO_IB_CONNECTIONS on each node has one record from its IPv6
    address to the peer's, with the two addresses as GIDs (RoCE v2), swapped between the nodes;
    RDS_INFO_IB_CONNECTIONS (IPv4 only: ib.c ``rds_ib_conn_info_visitor`` skips ``c_isv6``) has none."""
    a, b = _pair6(rds_ib_pair)
    a.sendto(b"ping", b.getsockname())
    assert b.recv(64) == b"ping"
    b.sendto(b"pong", a.getsockname())
    assert a.recv(64) == b"pong"
    seen: dict[str, str] = {}
    v6_table, v4_table = int(InfoType.RDS6_INFO_IB_CONNECTIONS), int(InfoType.RDS_INFO_IB_CONNECTIONS)
    for node, sock, peer in ((rds_ib_pair.a, a, rds_ib_pair.b), (rds_ib_pair.b, b, rds_ib_pair.a)):
        own, other = ipaddress.IPv6Address(node.addr6), ipaddress.IPv6Address(peer.addr6)
        size, rows = node.agent.wait(
            node.agent.job("pyrds.testing.ib:info_table", [sock], table=v6_table), 60.0
        )
        mine = [r for r in rows if (r.src_addr, r.dst_addr) == (own, other)]
        _size4, rows4 = node.agent.wait(
            node.agent.job("pyrds.testing.ib:info_table", [sock], table=v4_table), 60.0
        )
        # a v4 record of this connection would carry the IPv6 addresses' last 4 bytes (c_laddr.s6_addr32[3])
        tails = (ipaddress.IPv4Address(own.packed[-4:]), ipaddress.IPv4Address(other.packed[-4:]))
        in_v4 = [r for r in rows4 if (r.src_addr, r.dst_addr) == tails]
        gids = "-"
        if len(mine) == 1:
            r = mine[0]
            as_addrs = (r.src_gid, r.dst_gid) == (own.packed, other.packed)
            gids = "own/peer" if as_addrs else f"{r.src_gid.hex()}/{r.dst_gid.hex()}"
        seen[node.name] = f"{len(mine)} record(s), size {size}, gids {gids}, {len(in_v4)} in the v4 table"
        print(f"{node.name} {own} -> {other}: {seen[node.name]}; {mine}")
    rds_observe("records", "; ".join(f"{n}: {v}" for n, v in seen.items()))
    want = f"1 record(s), size {info.record_size(v6_table)}, gids own/peer, 0 in the v4 table"
    assert seen == {"A": want, "B": want}
