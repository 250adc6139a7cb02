"""Fixtures: every test gets its own stack service (unique PYRDS_STACK_NAME, no TCP listener clash);
``userspace_netns_pair``: two userspace stacks in two network namespaces."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def isolated_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"pyrds-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("PYRDS_STACK_NAME", name)
    monkeypatch.setenv("PYRDS_TCP_PORT", str(20000 + int(name[-4:], 16) % 20000))
    monkeypatch.setenv("PYRDS_IDLE_EXIT", "1")
    yield name


@pytest.fixture
def userspace_netns_pair(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Two userspace stacks in two network namespaces (:class:`pyrds.testing.topology.TwoNodes`; node A has
    the smaller address). Needs root, and nft too where the test has the ``nft`` marker: skipped otherwise."""
    needs_nft = request.node.get_closest_marker("nft") is not None
    if os.geteuid() != 0 or (needs_nft and shutil.which("nft") is None):
        pytest.skip("needs root and nft" if needs_nft else "needs root")
    monkeypatch.delenv("PYRDS_TCP_PORT", raising=False)  # the stacks live in their own namespaces: port 16385
    from pyrds.testing.topology import TwoNodes

    pair = TwoNodes.create(["userspace", "userspace"])
    try:
        yield pair
    finally:
        pair.destroy()
