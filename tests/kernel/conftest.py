"""Fixtures for kernel-only tests: they run inside the VM guest and skip cleanly without AF_RDS.

See kernel_helpers.py for the topology (rxe on a dummy link; veth + a peer netns for RDS/TCP).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from kernel_helpers import _af_rds_reason, rxe_gen, sockets_gen, tcp_net_gen


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _af_rds_reason()
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.kernel)
            # the plugin's hang guard (--rds-timeout) only covers tests that ask for it; these use no plugin
            # fixture, and a hung AF_RDS call must fail its test, not stall the guest run
            if item.get_closest_marker("rds_timeout") is None:
                item.add_marker(pytest.mark.rds_timeout)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def needs_af_rds() -> None:
    """Skip (never pass) when this kernel has no AF_RDS."""
    reason = _af_rds_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def tcp_net() -> Iterator[dict[str, str]]:
    yield from tcp_net_gen()


@pytest.fixture(scope="session")
def rxe_ip() -> Iterator[str]:
    yield from rxe_gen()


@pytest.fixture
def sockets() -> Iterator[list[Any]]:
    yield from sockets_gen()
