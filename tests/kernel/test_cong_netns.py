"""The kernel's congestion maps are one per address for the whole host, not one per network namespace
(cong.c: rds_cong_tree is a global tree keyed by address; a connection's local and foreign maps are looked
up in it by address alone). Two namespaces that carry the same address share its map: a port congested in
one namespace is congested for senders in the other. The conformance suite's two-node pairs therefore never
share an address while alive (pyrds.testing.topology.pair_addresses). The userspace stack keeps one set of
maps per stack, i.e. per namespace."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from kernel_helpers import make_socket, modprobe, sh

from pyrds.testing.helpers import send_until_enobufs

ADDR = "10.198.77.2"  # outside every subnet the suites use
NAMESPACES = ("rdscongx", "rdscongy")


@pytest.fixture
def two_namespaces_one_address() -> Iterator[tuple[str, str]]:
    if not modprobe("rds_tcp"):
        pytest.skip("rds_tcp module not available")
    for ns in NAMESPACES:
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "add", "rdsc0", "type", "dummy")
        sh("ip", "-n", ns, "addr", "add", f"{ADDR}/24", "dev", "rdsc0")
        sh("ip", "-n", ns, "link", "set", "rdsc0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    try:
        yield NAMESPACES
    finally:
        for ns in NAMESPACES:
            sh("ip", "netns", "del", ns, check=False)


def _send_refused(sock: Any, port: int) -> bool:
    try:
        sock.sendto(b"", (ADDR, port))
    except OSError as exc:
        assert exc.errno == errno.ENOBUFS, exc
        return True
    return False


def test_congestion_map_is_shared_by_namespaces_with_one_address(
    two_namespaces_one_address: tuple[str, str], sockets: list[Any]
) -> None:
    ns_x, ns_y = two_namespaces_one_address
    # namespace Y: a receiver that never reads, filled over the loop transport until its port is congested
    receiver = make_socket(netns=ns_y)
    sender = make_socket(netns=ns_y)
    sockets += [receiver, sender]
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    receiver.bind((ADDR, 0))
    sender.bind((ADDR, 0))
    sender.setblocking(False)
    port = receiver.getsockname()[1]
    _sent, congested = send_until_enobufs(sender, (ADDR, port), 1024, timeout=30.0)
    assert congested and _send_refused(sender, port), "the receiver's port never became congested"
    # namespace X: nothing there is congested, yet a sender bound to the same address is refused for that port
    # number; its own receiver's port stays open
    here_recv = make_socket(netns=ns_x)
    here_send = make_socket(netns=ns_x)
    sockets += [here_recv, here_send]
    here_recv.bind((ADDR, 0))
    here_send.bind((ADDR, 0))
    here_send.setblocking(False)
    assert not _send_refused(here_send, here_recv.getsockname()[1])
    assert _send_refused(here_send, port)
    # closing the congested receiver in Y clears the bit (rds_cong_remove_socket): X's sender gets through
    receiver.close()
    assert not _send_refused(here_send, port)
