"""Restart without loss (issue 8 item 4; docs/userspace.md, "Restart"): a userspace stack service killed with
SIGKILL in the middle of a transfer between two namespaces, on either node.

A sends 20,000 messages from 16 sockets (spread over the RDS/TCP paths by the socket hash) to one socket on
B. A has the smaller address, so it owns (dials) the connection and B only accepts.

* B's service killed (the acceptor, receiving side). The survivor A retransmits what B's TCP had not acked;
  a new receiver on B (which starts a new service) binds the same address and port. Per sending socket, the
  old receiver got an in-order prefix 0..k-1, the new one an in-order run m..end with m >= k: every message
  A's sender was told was sent arrives exactly once and in order, except m - k messages that B's TCP had
  acked before the kill and that died with B's service (its receive queue, the bytes in its TCP socket): the
  kernel-crash equivalent, counted. All 8 paths come back.
* A's service killed (the owner, sending side). B, the survivor, got an in-order prefix of each socket's
  messages, no more than A's sender was told were sent (the rest died with A's service: counted); a new
  sender on A (a new service, sequence numbers from 1 again) sends 2,000 more, and B gets every one exactly
  once, in order (the survivor must not drop them as old).

Each case runs 5 rounds. Root only (network namespaces).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrds.testing.restart import (
    check_across_restart,
    check_prefix_of_told,
    expected_per_socket,
    gate,
    kill_and_wait,
    per_socket,
    wait_progress,
)
from tests.unit.userspace.fakes import veth_namespaces

pytestmark = pytest.mark.netns

A, B = "10.67.0.1", "10.67.0.9"
SPORT, DPORT = 6000, 5000
NSOCK = 16
COUNT = 20_000
AFTER = 2_000  # sent by a new sender after A's service was killed
KILL_AT = 4_000  # B has received this many when the service is killed
LOST_BOUND = 10_000  # see the assertion: structural, grows with how far B's reader lags (host load)
ROOT = str(Path(__file__).resolve().parents[3])
ROUNDS = int(os.environ.get("PYRDS_RESTART_ROUNDS", "5"))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with veth_namespaces("rst", [f"{A}/24"], [f"{B}/24"]) as nss:
        yield nss


def _env(tmp: Path, node: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=ROOT,
        PYRDS_IDLE_EXIT="3",
        PYRDS_STACK_LOG=str(tmp / f"stack-{node}.log"),
    )
    env.pop("PYRDS_TCP_PORT", None)
    env.pop("PYRDS_TCP_PEER_PORT", None)
    env.pop("PYRDS_STACK_NAME", None)
    return env


def _spawn(ns: str, tmp: Path, node: str, *args: object) -> subprocess.Popen[bytes]:
    from pyrds import netns

    argv = [sys.executable, "-m", "tests.unit.userspace.restart_peer", *map(str, args)]
    log = open(tmp / f"{node}-{args[0]}-{time.monotonic_ns()}.err", "wb")  # noqa: SIM115 - the child's
    try:
        return netns.popen_in_netns(ns, argv, env=_env(tmp, node), cwd=ROOT, stderr=log, stdout=log)
    finally:
        log.close()


def _wait_file(path: Path, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None and not path.exists():
            raise AssertionError(f"{proc.args!r} exited {proc.returncode} without writing {path.name}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} after {timeout} s")
        time.sleep(0.05)
    return json.loads(path.read_text())


def _paths_up(ns: str) -> int:
    from pyrds import netns

    out = netns.run_cmd_in_netns(ns, ["ss", "-Htn", "state", "established", "dst", f"{B}:16385"]).stdout
    return len(out.splitlines())


def _wait_paths(ns: str, want: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    n = _paths_up(ns)
    while n != want and time.monotonic() < deadline:
        time.sleep(0.2)
        n = _paths_up(ns)
    return n


def kill_receiver_side(ns_a: str, ns_b: str, tmp: Path) -> dict[str, int]:
    rx1 = _spawn(ns_b, tmp, "B", "recv", B, DPORT, NSOCK, COUNT, 1, 120, tmp / "rx1.json")
    b_pid = _wait_file(tmp / "rx1.json.pid", 60, rx1)
    tx = _spawn(ns_a, tmp, "A", "send", A, SPORT, NSOCK, B, DPORT, COUNT, 1, tmp / "tx.json")
    wait_progress(tmp / "rx1.json.progress", KILL_AT, 60)
    # B "reboots" behind a closed port, so its new receiver is bound before A's retransmissions arrive (a
    # message for a port nobody has bound yet is dropped, recv_drop_no_sock, as by a kernel). Without the gate
    # 5 rounds passed too (A's re-dial backoff let the reader bind first), but nothing guarantees that order.
    gate(ns_b, [16385], closed=True)
    kill_and_wait(b_pid)
    old = _wait_file(tmp / "rx1.json", 30, rx1)
    assert old["error"] is not None and old["error"] != "idle", old["error"]
    rx2 = _spawn(ns_b, tmp, "B", "recv", B, DPORT, NSOCK, COUNT, 1, 30, tmp / "rx2.json")
    _wait_file(tmp / "rx2.json.pid", 60, rx2)
    gate(ns_b, [16385], closed=False)
    new = _wait_file(tmp / "rx2.json", 120, rx2)
    sent = _wait_file(tmp / "tx.json", 30, tx)
    (tmp / "tx.json.close").touch()
    assert new["pid"] != b_pid
    assert sent["error"] is None, f"the surviving sender saw {sent['error']}"
    assert sent["sent"] == [expected_per_socket(COUNT, NSOCK, i) for i in range(NSOCK)]
    assert new["error"] is None, f"the new receiver stopped: {new['error']} after {len(new['got'])} messages"
    assert new["counters"]["recv_drop_no_sock"] == 0
    lost = check_across_restart(
        per_socket(old["got"], 1, NSOCK), per_socket(new["got"], 1, NSOCK), sent["sent"]
    )
    # What died with B: messages its TCP had acked (A freed them) that no reader had taken yet, in B's receive
    # queue (B's port congests at rcvbuf/2 = 1,664 such messages) or unread in its TCP sockets, plus what A
    # sent before it saw the congestion map. How many depends on how far B's reader lagged when the service
    # died (a kernel that crashes loses the same): seen 0 to 1,527 on an idle host, 4,674 once with another
    # namespace test and a QEMU guest beside it (which failed the first bound, 4,000). The bound only says the
    # transfer went on after the kill; loss after the restart would break the contiguity checks above.
    assert lost < LOST_BOUND, f"{lost} messages lost with B's service"
    paths = _wait_paths(ns_a, 8)
    assert paths == 8, f"{paths} RDS/TCP paths after the restart"
    for p in (rx1, rx2, tx):
        p.wait(10)
    return {
        "old": len(old["got"]),
        "new": len(new["got"]),
        "lost_in_killed_node": lost,
        "errno": old["error"],
    }


def kill_sender_side(ns_a: str, ns_b: str, tmp: Path) -> dict[str, int]:
    rx = _spawn(ns_b, tmp, "B", "recv", B, DPORT, NSOCK, AFTER, 2, 120, tmp / "rx.json")
    _wait_file(tmp / "rx.json.pid", 60, rx)
    tx1 = _spawn(ns_a, tmp, "A", "send", A, SPORT, NSOCK, B, DPORT, COUNT, 1, tmp / "tx1.json")
    a_pid = _wait_file(tmp / "tx1.json.pid", 60, tx1)
    wait_progress(tmp / "rx.json.progress", KILL_AT, 60)
    kill_and_wait(a_pid)
    told = _wait_file(tmp / "tx1.json", 30, tx1)
    (tmp / "tx1.json.close").touch()
    assert told["error"] is not None, "the sender of the killed service saw no error"
    tx2 = _spawn(ns_a, tmp, "A", "send", A, SPORT, NSOCK, B, DPORT, AFTER, 2, tmp / "tx2.json")
    got = _wait_file(tmp / "rx.json", 120, rx)
    sent2 = _wait_file(tmp / "tx2.json", 30, tx2)
    (tmp / "tx2.json.close").touch()
    assert sent2["pid"] != a_pid
    assert sent2["error"] is None, f"the new sender saw {sent2['error']}"
    assert got["error"] is None, f"the survivor stopped: {got['error']} after {len(got['got'])} messages"
    gen1, gen2 = per_socket(got["got"], 1, NSOCK), per_socket(got["got"], 2, NSOCK)
    lost = check_prefix_of_told(gen1, told["sent"])
    for i in range(NSOCK):
        assert gen2[i] == list(range(expected_per_socket(AFTER, NSOCK, i))), f"socket {i}: after the restart"
    paths = _wait_paths(ns_a, 8)
    assert paths == 8, f"{paths} RDS/TCP paths after the restart"
    for p in (rx, tx1, tx2):
        p.wait(10)
    received = sum(len(v) for v in gen1.values())
    return {"received_before": received, "lost_in_killed_node": lost, "errno": told["error"]}


def _stop_services(*nss: str) -> None:
    """The next round starts with no stack in either namespace."""
    from pyrds import netns

    for ns in nss:
        for pid in netns.netns_pids(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while any(netns.netns_pids(ns) for ns in nss) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("side", ["receiver", "sender"])
def test_service_killed_mid_transfer(pair: tuple[str, str], tmp_path: Path, side: str) -> None:
    ns_a, ns_b = pair
    results = []
    for r in range(ROUNDS):
        tmp = tmp_path / f"round{r}"
        tmp.mkdir()
        t0 = time.monotonic()
        run = kill_receiver_side if side == "receiver" else kill_sender_side
        res: dict[str, float] = dict(run(ns_a, ns_b, tmp))
        res["seconds"] = round(time.monotonic() - t0, 1)
        results.append(res)
        print(f"round {r}: {res}")
        _stop_services(ns_a, ns_b)
    print(results)


def test_loop_service_killed_mid_transfer(tmp_path: Path) -> None:
    """The loop transport (127.0.0.1 -> 127.0.0.1): a message is delivered into the receiver's queue, in the
    service, when sendto() returns, so a killed service takes every message still queued for a reader with
    it, as a crashing kernel takes its sockets' receive queues. Both clients get an error (never a hang);
    what the reader got is an in-order prefix of each socket's messages, no more than the sender was told
    were sent; the difference is the count documented in docs/userspace.md ("Restart"); sockets opened
    after the restart (a new service) work."""
    env = dict(os.environ, PYTHONPATH=ROOT, PYRDS_STACK_LOG=str(tmp_path / "stack.log"))

    def spawn(*args: object) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tests.unit.userspace.restart_peer", *map(str, args)]
        return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    lo = "127.0.0.1"
    rx = spawn("recv", lo, DPORT, NSOCK, COUNT, 1, 60, tmp_path / "rx.json")
    pid = _wait_file(tmp_path / "rx.json.pid", 60, rx)
    tx = spawn("send", lo, SPORT, NSOCK, lo, DPORT, COUNT, 1, tmp_path / "tx.json")
    wait_progress(tmp_path / "rx.json.progress", KILL_AT, 60)
    kill_and_wait(pid)
    got = _wait_file(tmp_path / "rx.json", 30, rx)
    told = _wait_file(tmp_path / "tx.json", 30, tx)
    (tmp_path / "tx.json.close").touch()
    assert got["error"] not in (None, "idle"), "the reader of the killed service saw no error"
    per = per_socket(got["got"], 1, NSOCK)
    lost = 0
    for i in range(NSOCK):
        k = len(per[i])
        assert per[i] == list(range(k)) and k <= told["sent"][i]
        lost += told["sent"][i] - k
    print(
        f"loop: told sent {sum(told['sent'])}, read {len(got['got'])}, lost with the service {lost}, errnos",
        got["error"],
        told["error"],
    )
    rx2 = spawn("recv", lo, DPORT, NSOCK, AFTER, 2, 30, tmp_path / "rx2.json")
    _wait_file(tmp_path / "rx2.json.pid", 60, rx2)
    tx2 = spawn("send", lo, SPORT, NSOCK, lo, DPORT, AFTER, 2, tmp_path / "tx2.json")
    after = _wait_file(tmp_path / "rx2.json", 60, rx2)
    (tmp_path / "tx2.json.close").touch()
    assert after["pid"] != pid and after["error"] is None
    per2 = per_socket(after["got"], 2, NSOCK)
    assert all(per2[i] == list(range(expected_per_socket(AFTER, NSOCK, i))) for i in range(NSOCK))
    for p in (rx, tx, rx2, tx2):
        p.wait(10)
