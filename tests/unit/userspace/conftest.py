"""Fixtures: every test gets its own stack service (unique PYRDS_STACK_NAME, no TCP listener clash)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def isolated_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"pyrds-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("PYRDS_STACK_NAME", name)
    monkeypatch.setenv("PYRDS_TCP_PORT", str(20000 + int(name[-4:], 16) % 20000))
    monkeypatch.setenv("PYRDS_IDLE_EXIT", "1")
    yield name
