"""ping_enable applies to connections that are already up (issue 8: after ``ping_enable=0`` the stack's
existing RDS/TCP paths still answered pings).

The kernel reads ``rds_sysctl_ping_enable`` for every incoming message (``rds_recv_incoming``): with it 0, a
ping (dport 0) is not answered and, like any message for an unbound port, is dropped (``recv_drop_no_sock``).
A raw RDS/TCP peer in a second namespace pings the service over one connection while the setting changes.
Root only (network namespaces).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyrds.userspace.control import stack_counters
from tests.unit.userspace.fakes import veth_namespaces
from tests.unit.userspace.test_bounded_resources import DST, SRC, _bound_socket, _peer, frame, stack_env

pytestmark = pytest.mark.netns

HEADER = 48
PINGER_PORT = 4000


@pytest.fixture
def wire() -> Iterator[tuple[str, str]]:
    with stack_env(), veth_namespaces("png", [f"{SRC}/24"], [f"{DST}/24"]) as pair:
        yield pair


def _wait_counter(sink: Any, name: str, value: int) -> None:
    deadline = time.monotonic() + 20
    while stack_counters(sink).get(name, 0) < value:
        assert time.monotonic() < deadline, f"{name} never reached {value}: {stack_counters(sink)}"
        time.sleep(0.05)


def _pongs(peer: socket.socket, wait: float) -> list[tuple[int, int]]:
    """(sport, dport) of every whole message the service sent to ``peer`` within ``wait`` seconds."""
    data = b""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        peer.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = peer.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    out = []
    while len(data) >= HEADER:
        length, sport, dport = struct.unpack_from(">I", data, 16)[0], *struct.unpack_from(">HH", data, 20)
        out.append((sport, dport))
        data = data[HEADER + length :]
    return out


def test_ping_enable_0_stops_pongs_on_a_live_connection_and_1_restores_them(wire: tuple[str, str]) -> None:
    a, b = wire
    sink = _bound_socket(b)  # starts the service in b
    peer = _peer(a)
    try:
        peer.sendall(frame(1, 0, b"", sport=PINGER_PORT))
        _wait_counter(sink, "recv_ping", 1)
        assert (0, PINGER_PORT) in _pongs(peer, 2.0)

        sink.sysctl_set("ping_enable", 0)
        before = stack_counters(sink)
        peer.sendall(frame(2, 0, b"", sport=PINGER_PORT))
        _wait_counter(sink, "recv_drop_no_sock", before.get("recv_drop_no_sock", 0) + 1)
        after = stack_counters(sink)
        assert after["recv_ping"] == before["recv_ping"] and after["send_pong"] == before["send_pong"]
        assert (0, PINGER_PORT) not in _pongs(peer, 1.5)

        sink.sysctl_set("ping_enable", 1)
        peer.sendall(frame(3, 0, b"", sport=PINGER_PORT))
        _wait_counter(sink, "recv_ping", before["recv_ping"] + 1)
        assert (0, PINGER_PORT) in _pongs(peer, 2.0)
    finally:
        sink.sysctl_set("ping_enable", 1)
        sink.close()
        peer.close()
