"""Host tests for pyrds.netns (need root + network namespaces; skipped otherwise)."""

from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("pyroute2")

from pyrds import netns  # noqa: E402

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces"),
]


def _udp_bound(family: int, addr: str) -> socket.socket:
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((addr, 0))
    s.settimeout(5.0)
    return s


def _tcp_listener(family: int, addr: str) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((addr, 0))
    s.listen(1)
    s.settimeout(5.0)
    return s


def _tcp_client(family: int, addr: tuple[str, int]) -> socket.socket:
    return socket.create_connection(addr, timeout=5.0)


def test_pair_create_and_cleanup() -> None:
    with netns.netns_pair() as pair:
        assert netns.netns_exists(pair.ns_a) and netns.netns_exists(pair.ns_b)
        out = netns.run_cmd_in_netns(pair.ns_a, ["ip", "-o", "addr", "show", "dev", pair.if_a]).stdout
        assert pair.addr4_a in out and str(pair.addr6_a) in out
        line6 = next(ln for ln in out.splitlines() if str(pair.addr6_a) in ln)
        assert "tentative" not in line6  # nodad
    assert not netns.netns_exists(pair.ns_a) and not netns.netns_exists(pair.ns_b)


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_udp_across_namespaces(family: int) -> None:
    with netns.netns_pair() as pair:
        a_addr = pair.addr4_a if family == socket.AF_INET else str(pair.addr6_a)
        b_addr = pair.addr4_b if family == socket.AF_INET else str(pair.addr6_b)
        rx = netns.run_in_netns(pair.ns_b, _udp_bound, family, b_addr)
        tx = netns.run_in_netns(pair.ns_a, _udp_bound, family, a_addr)
        with rx, tx:
            tx.sendto(b"hello", rx.getsockname()[:2])
            data, peer = rx.recvfrom(100)
            assert data == b"hello"
            assert peer[0] == a_addr


def test_tcp_across_namespaces_with_netem() -> None:
    if not netns.netem_available():
        pytest.skip("kernel has no sch_netem (e.g. this host); runs in the VM guest")
    impair = netns.Netem(delay_ms=20, loss_pct=1.0, duplicate_pct=1.0, corrupt_pct=0.5)
    with netns.netns_pair(netem=impair) as pair:
        qd = netns.run_cmd_in_netns(pair.ns_a, ["tc", "qdisc", "show", "dev", pair.if_a]).stdout
        assert "netem" in qd and "delay 20ms" in qd and "loss 1%" in qd
        lst = netns.run_in_netns(pair.ns_b, _tcp_listener, socket.AF_INET, pair.addr4_b)
        with lst:
            cli = netns.run_in_netns(pair.ns_a, _tcp_client, socket.AF_INET, lst.getsockname())
            conn, peer = lst.accept()
            with cli, conn:
                assert peer[0] == pair.addr4_a
                payload = os.urandom(200_000)
                cli.sendall(payload)
                cli.shutdown(socket.SHUT_WR)
                got = bytearray()
                conn.settimeout(30.0)
                while chunk := conn.recv(65536):
                    got += chunk
                assert bytes(got) == payload
        netns.clear_netem(pair.ns_a, pair.if_a)
        qd = netns.run_cmd_in_netns(pair.ns_a, ["tc", "qdisc", "show", "dev", pair.if_a]).stdout
        assert "netem" not in qd


def test_popen_in_netns_sees_only_its_links() -> None:
    with netns.netns_pair() as pair:
        proc = netns.popen_in_netns(pair.ns_b, ["ip", "-o", "link"], stdout=-1, text=True)
        out, _ = proc.communicate(timeout=10)
        assert pair.if_b in out and pair.if_a not in out


def test_enter_netns_restores_thread() -> None:
    before = os.readlink("/proc/thread-self/ns/net")
    with netns.netns_pair() as pair:
        with netns.enter_netns(pair.ns_a):
            assert os.readlink("/proc/thread-self/ns/net") != before
        assert os.readlink("/proc/thread-self/ns/net") == before


def test_netem_validation() -> None:
    with pytest.raises(ValueError):
        netns.Netem(loss_pct=101)
    with pytest.raises(ValueError):
        netns.Netem(reorder_pct=10)
    assert netns.Netem(delay_ms=1.5).tc_kwargs()["delay"] == 1500
