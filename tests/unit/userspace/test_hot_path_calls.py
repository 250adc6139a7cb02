"""The service's per-message path (issue 10): what it asks of the protocol engine, and the profile a developer
takes of it.

An RDS/TCP path asks its engine for buffers only when the engine holds output (``PathEngine.has_output``): a
flush after a read that queued no pong, and the second look after a write that took everything, used to call
``buffers_to_send`` for nothing, once or twice per message. ``PYRDS_STACK_PROFILE=<dir>`` runs a service under
cProfile and writes its statistics when it stops (docs/userspace-profile.md takes its figures that way)."""

from __future__ import annotations

import os
import pstats
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from pyrds import netns
from pyrds.userspace.proto import PathEngine
from pyrds.userspace.stack.sockstate import Outgoing
from pyrds.userspace.transports.tcp.path import TcpPath
from tests.unit.userspace.test_tcp_path_close import FADDR, LADDR, FakeConn


class _CountingEngine:
    """Counts ``buffers_to_send`` calls of one engine (the rest passes through)."""

    def __init__(self, engine: PathEngine) -> None:
        self.calls = 0
        inner = engine.buffers_to_send

        def counted(*args: Any, **kwargs: Any) -> list[bytes]:
            self.calls += 1
            return inner(*args, **kwargs)

        engine.buffers_to_send = counted  # type: ignore[method-assign]


def _recv_exactly(peer: socket.socket, size: int) -> bytes:
    peer.settimeout(5)
    got = b""
    while len(got) < size:
        chunk = peer.recv(size - len(got))
        assert chunk, "the path closed the connection"
        got += chunk
    return got


def test_a_flush_asks_the_engine_for_buffers_only_when_it_holds_output(
    tcp_pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, peer = tcp_pair
    path = TcpPath(FakeConn(), 1)  # type: ignore[arg-type]
    path.established(ours)  # a path > 0 sends its congestion map first
    _recv_exactly(peer, 48 + 8192)
    counting = _CountingEngine(path.engine)
    for _ in range(3):
        path.flush()  # nothing queued: as after a read that needed no answer
    assert counting.calls == 0
    path.queue(Outgoing(0, LADDR, FADDR, 4000, 5000, b"x" * 100))
    assert counting.calls == 1  # the write took it all: no second call that returns nothing
    frame = _recv_exactly(peer, 48 + 100)
    assert frame.endswith(b"x" * 100)
    path.engine.queue_cong_map()  # the map alone is output too
    path.flush()
    assert counting.calls == 2
    assert len(_recv_exactly(peer, 48 + 8192)) == 48 + 8192


def _pushes(stats: pstats.Stats) -> int:
    """Calls of DataChannel.push in the statistics: one per message pushed to a reader."""
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    return sum(v[1] for k, v in table.items() if k[2] == "push" and "datachannel" in k[0])


def _service_pids(ns: str) -> list[int]:
    pids = []
    for pid in netns.netns_pids(ns):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"pyrds.userspace.service" in cmdline:
            pids.append(pid)
    return pids


def _stop_and_wait(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, "a stopped service did not exit"
        time.sleep(0.05)


@pytest.mark.netns
def test_stack_profile_is_written_when_the_service_stops(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    monkeypatch.setenv("PYRDS_STACK_PROFILE", str(profiles))
    pair = request.getfixturevalue("userspace_netns_pair")
    a, b = pair.bound_pair()
    b_addr = b.getsockname()
    for i in range(50):
        a.sendto(b"m%d" % i, b_addr)
        assert b.recv(100) == b"m%d" % i
    pids = [pid for node in pair.nodes for pid in _service_pids(node.netns)]
    assert len(pids) == 2, pids
    _stop_and_wait(pids)
    files = sorted(profiles.iterdir())
    assert [f.name for f in files] == sorted(f"stack-{pid}.prof" for pid in pids)
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600
    pushes = {f.name: _pushes(pstats.Stats(str(f))) for f in files}
    # the receiving node's service pushed each message to its reader's data channel
    assert max(pushes.values()) >= 50, pushes


def test_stack_profile_never_writes_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The statistics file is created new: an existing file or a symbolic link at its name is left as it was
    (the service logs that it could not write)."""
    from pyrds.userspace.service import daemon

    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    (tmp_path / f"stack-{os.getpid()}.prof").symlink_to(target)

    class _Svc:
        def serve_forever(self) -> None:
            pass

    daemon._serve_profiled(_Svc(), str(tmp_path))  # type: ignore[arg-type]
    assert target.read_bytes() == b"keep"
    (tmp_path / f"stack-{os.getpid()}.prof").unlink()
    daemon._serve_profiled(_Svc(), str(tmp_path))  # type: ignore[arg-type]
    stats = pstats.Stats(str(tmp_path / f"stack-{os.getpid()}.prof"))
    assert any(k[2] == "serve_forever" for k in stats.stats)  # type: ignore[attr-defined]
