"""Two-node pairs made at the same time by different xdist workers never share an address: the kernel's
congestion maps (cong.c's rds_cong_tree) and bind table are one per host, keyed by address alone."""

from __future__ import annotations

import ipaddress

import pytest

from pyrds.testing.topology import pair_addresses, worker_index


def _all(worker: int) -> set[str]:
    return {a for k in range(256) for pair in pair_addresses(worker, k) for a in pair}


def test_workers_never_share_an_address() -> None:
    seen: set[str] = set()
    for worker in range(8):
        mine = _all(worker)
        assert len(mine) == 256 * 4  # and a worker's own 256 consecutive pairs are all distinct
        assert not mine & seen
        seen |= mine


def test_node_a_is_the_smaller_address_and_outside_the_ib_and_link_subnets() -> None:
    for worker in (0, 1, 57):
        for k in (0, 1, 255, 256, 1000):
            (a4, a6), (b4, b6) = pair_addresses(worker, k)
            assert ipaddress.ip_address(a4) < ipaddress.ip_address(b4)
            assert ipaddress.ip_address(a6) < ipaddress.ip_address(b6)
            assert ipaddress.ip_address(a4) not in ipaddress.ip_network("10.99.0.0/16")


@pytest.mark.parametrize(("env", "want"), [("gw0", 0), ("gw1", 1), ("gw12", 12)])
def test_worker_index_from_xdist(monkeypatch: pytest.MonkeyPatch, env: str, want: int) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", env)
    assert worker_index() == want


def test_worker_index_without_xdist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert 50 <= worker_index() < 100  # away from the first workers' subnets
