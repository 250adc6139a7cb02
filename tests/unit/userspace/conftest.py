"""Fixtures: every test gets its own stack service (unique PYRDS_STACK_NAME, no TCP listener clash);
``userspace_netns_pair``: two userspace stacks in two network namespaces; ``loop_pair``: two userspace sockets
on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import pyrds


@pytest.fixture(autouse=True)
def isolated_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"pyrds-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("PYRDS_STACK_NAME", name)
    monkeypatch.setenv("PYRDS_TCP_PORT", str(20000 + int(name[-4:], 16) % 20000))
    monkeypatch.setenv("PYRDS_IDLE_EXIT", "1")
    yield name
    _no_immortal_stack(name)


def _no_immortal_stack(name: str) -> None:
    """Fail the test (and stop the stack) when it left this namespace's test stack with its idle exit turned
    off: nothing would ever stop that service (seen: hours-old pyrds-test-* services after host runs)."""
    from pyrds.userspace import rpc
    from pyrds.userspace.client.stackctl import WrongServer, stack_request

    try:
        status = stack_request(name, os.geteuid(), rpc.Op.STATUS, timeout=5.0)
    except (OSError, EOFError, WrongServer):
        return
    if not isinstance(status, dict) or status.get("idle_exit", 0) >= 0:
        return
    try:
        stack_request(name, os.geteuid(), rpc.Op.STOP, timeout=5.0)
    except (OSError, EOFError, WrongServer):
        pass
    pid = status.get("pid")
    pytest.fail(f"the test left stack {name!r} (pid {pid}) serving with no idle exit; stopped it")


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


@contextlib.contextmanager
def tcp_connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A new loopback TCP connection: (ours, non-blocking; the peer's end), both closed on exit."""
    with socket.create_server(("127.0.0.1", 0)) as lst:
        peer = socket.create_connection(lst.getsockname())
        ours, _ = lst.accept()
    ours.setblocking(False)
    with ours, peer:
        yield ours, peer


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected loopback TCP pair: (ours, non-blocking; the peer's end)."""
    with tcp_connection() as pair:
        yield pair


@pytest.fixture
def loop_pair() -> Iterator[tuple[Any, Any, Any]]:
    """A receiving and a sending userspace socket on 127.0.0.1 (the loop connection set up by a first
    message, read), and the receiver's address."""
    rx = pyrds.socket("userspace")
    tx = pyrds.socket("userspace")
    try:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        dest = rx.getsockname()
        tx.sendto(b"warm", dest)
        assert rx.recv(100) == b"warm"
        yield rx, tx, dest
    finally:
        rx.close()
        tx.close()
