"""Issue 8 item 5, end to end: two userspace stacks in two network namespaces; a raw TCP client on node A
(the smaller address, which owns the RDS/TCP connection) dials node B's RDS/TCP port from source ports
shaped like A's paths and writes messages that claim to come from A's socket. No kernel lets such a
connection take a path that is up (``rds_tcp_accept_one_path`` claims RDS_CONN_DOWN paths only), so none
may be delivered; genuine reconnects (either side's forced reconnect, A's service killed and started
again) must still carry messages. Before the fix each forged connection replaced a live path and its
message was delivered as A."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from typing import Any

import pytest

from pyrds.userspace.proto.header import RDSHeader
from pyrds.userspace.proto.pathset import dial_port
from pyrds.userspace.transports.tcp.conn import PROOF_DELAY

pytestmark = pytest.mark.netns


def forged(seq: int, sport: int, dport: int, payload: bytes) -> bytes:
    return RDSHeader(seq, 0, len(payload), sport, dport, 0, 0, 0, ()).encode() + payload


def dial_as_path(nodes: Any, index: int) -> socket.socket:
    """A plain TCP connection from node A's address, from a source port naming path ``index`` (a pyrds
    tag, ``port % 8 == index`` too), to node B's RDS/TCP listener."""
    from pyrds import netns

    na, nb = nodes.a, nodes.b

    def dial() -> socket.socket:
        for _ in range(64):
            s = socket.socket()
            try:
                s.bind((na.addr4, dial_port(random.getrandbits(16), index)))
            except OSError:
                s.close()
                continue
            s.settimeout(10)
            s.connect((nb.addr4, nb.tcp_port))
            return s
        raise RuntimeError("no free source port for the forger")

    return netns.run_in_netns(na.netns, dial)


def expect(b: Any, want: bytes, timeout: float = 30.0) -> None:
    b.settimeout(timeout)
    got = b.recv(4096)
    assert got == want, f"expected {want!r}, got {got!r}"


def nothing_more(b: Any, wait: float = 1.0) -> None:
    b.settimeout(wait)
    with pytest.raises(OSError):  # TimeoutError: no (forged) message waiting
        got = b.recv(4096)
        raise AssertionError(f"unexpected message {got!r}")


def kill_service(node: Any) -> None:
    """SIGKILL the stack service of ``node``'s namespace (its kernel then closes its TCP sockets)."""
    from pyrds import netns

    for pid in netns.netns_pids(node.netns):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"pyrds.userspace.service" in f.read():
                os.kill(pid, signal.SIGKILL)
                break
    else:
        raise AssertionError(f"no stack service in {node.netns}")
    deadline = time.monotonic() + 10  # gone (or a zombie): its name is free for the next service
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"stack service {pid} still running")


def test_forged_path_connections_are_not_delivered_and_reconnects_still_work(
    userspace_netns_pair: Any,
) -> None:
    a, b = userspace_netns_pair.bound_pair()
    a_port, b_addr = a.getsockname()[1], b.getsockname()
    a.sendto(b"warm-up", b_addr)  # the handshake is done by now; let the owner bring its other paths up
    expect(b, b"warm-up")
    time.sleep(1.0)
    forgers = []
    for index in range(8):
        s = dial_as_path(userspace_netns_pair, index)
        s.sendall(forged(1000 + index, a_port, b_addr[1], b"forged-%d" % index))
        forgers.append(s)
    time.sleep(0.5)
    a.sendto(b"genuine-1", b_addr)
    expect(b, b"genuine-1")
    nothing_more(b)
    # refused once the live paths proved alive (keepalive probe acked): the forger's connections end
    deadline = time.monotonic() + PROOF_DELAY + 10
    for s in forgers:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(65536) == b"", "a forged connection was read or kept"
        s.close()
    # genuine reconnects: the acceptor's, the owner's, and the owner's service restarted
    for n, node in enumerate((userspace_netns_pair.b, userspace_netns_pair.a)):
        node.force_reconnect()
        a.sendto(b"after-reset-%d" % n, b_addr)
        expect(b, b"after-reset-%d" % n)
    kill_service(userspace_netns_pair.a)
    for attempt in range(50):  # the agent's next socket starts a new service
        try:
            a2 = userspace_netns_pair.a.socket()
            a2.bind((userspace_netns_pair.a.addr4, 0))
            break
        except OSError:
            if attempt == 49:
                raise
            time.sleep(0.1)
    a2.sendto(b"after-restart", b_addr)
    expect(b, b"after-restart")
    nothing_more(b)


def test_forged_connection_waiting_for_a_path_is_not_delivered_after_the_path_goes_down(
    userspace_netns_pair: Any,
) -> None:
    """A forger that keeps its connection open while the genuine path lives, then the path is reset: the
    waiting connection was refused before (the live path proved alive), so the re-dialled path carries
    only the genuine messages."""
    a, b = userspace_netns_pair.bound_pair()
    a_port, b_addr = a.getsockname()[1], b.getsockname()
    time.sleep(1.0)
    s = dial_as_path(userspace_netns_pair, 0)
    s.sendall(forged(5000, a_port, b_addr[1], b"forged"))
    time.sleep(PROOF_DELAY + 1.5)
    userspace_netns_pair.b.force_reconnect()
    a.sendto(b"genuine", b_addr)
    expect(b, b"genuine")
    nothing_more(b, 2.0)
    s.close()
