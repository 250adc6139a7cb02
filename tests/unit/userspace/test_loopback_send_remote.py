"""A socket bound to a loopback address sends through the loop transport whatever the destination
(rds_conn_create keeps the socket's rs_transport; only a local destination makes a connection loopback), so a
send from 127.0.0.1 / ::1 to a remote address is delivered locally to nobody (recv_drop_no_sock), as the
kernel's rds_loop_xmit does. It never reaches the RDS/TCP transport: the control fuzz (tests/fuzz) sent such
records and every one left a TcpConn from 127.0.0.1 to a random address that redialled, and queued another
probe, for as long as the service lived, after its socket and control connection were gone."""

from __future__ import annotations

import ipaddress

from pyrds.userspace.stack.core import LOCAL_CACHE_MAX, Stack
from pyrds.userspace.stack.outbox import Outbox
from pyrds.userspace.transports import loop_transport, tcp_transport
from tests.unit.userspace.fakes import FakeSvc

ROUNDS = 50


def test_loopback_socket_sends_to_remote_addresses_leave_no_transport_state() -> None:
    stack = Stack()
    stack.attach(loop_transport(stack))
    tcp = tcp_transport(stack, FakeSvc())  # not started: no listener; a dial would only be recorded in conns
    stack.attach(tcp)
    sent = 0
    for i in range(ROUNDS):
        for local, remote in (
            ("127.0.0.1", f"198.51.100.{i + 1}"),
            ("::1", f"2001:db8::{i + 1:x}"),
            ("127.0.0.1", f"0.0.1.{i + 1}"),
        ):
            rs = stack.open()
            stack.bind(rs, ipaddress.ip_address(local), 0, 0)
            outbox = Outbox()
            n = stack.sendmsg(rs, b"hello", [], 0, (ipaddress.ip_address(remote), 4000), True, outbox)
            outbox.flush(stack.transmit_failed)
            assert n == 5
            sent += 1
            assert rs.snd_bytes == 0 and not rs.sent  # acked at once by the loop transport
            stack.close(rs)
    assert tcp.conns == {}  # nothing dialled over RDS/TCP
    assert stack.socks == {}
    assert len(stack.ports) == 0
    assert stack.counters["recv_drop_no_sock"] == sent
    tcp.close()


def test_local_address_cache_is_bounded() -> None:
    stack = Stack()
    for i in range(LOCAL_CACHE_MAX + 500):
        assert not stack.is_local(ipaddress.ip_address(f"2001:db8::{i + 1:x}"))
    assert len(stack._local_cache) <= LOCAL_CACHE_MAX
    assert stack.is_local(ipaddress.ip_address("127.0.0.1"))
