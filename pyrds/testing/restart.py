"""What the restart scenarios share (a stack service killed mid-transfer: tests/conformance/test_restart.py in
the guests, tests/unit/userspace/test_restart_netns.py on the host): counting messages per sending socket,
waiting for a receiver's progress file, and killing a service. The traffic itself is
:func:`pyrds.testing.workloads.restart_send` / :func:`~pyrds.testing.workloads.restart_recv`."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


def per_socket(got: Iterable[Sequence[int]], gen: int, nsock: int) -> dict[int, list[int]]:
    """The message numbers of generation ``gen`` that each of ``nsock`` sending sockets delivered, in
    arrival order (``got``: (generation, socket, number) per message)."""
    out: dict[int, list[int]] = {i: [] for i in range(nsock)}
    for g, s, j in got:
        if g == gen:
            out[s].append(j)
    return out


def expected_per_socket(count: int, nsock: int, i: int) -> int:
    """How many of ``count`` messages sent round-robin from ``nsock`` sockets socket ``i`` sent."""
    return count // nsock + (1 if i < count % nsock else 0)


def wait_progress(path: Path, at_least: int, timeout: float) -> None:
    """Until the number in ``path`` (a receiver's progress file) is at least ``at_least``; AssertionError
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            if int(path.read_text()) >= at_least:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the receiver did not reach {at_least} messages in {timeout:g} s")
        time.sleep(0.05)


def resume_file(progress: str | Path) -> Path:
    """The file whose existence lets a paused reader read on (:func:`pyrds.testing.workloads.restart_recv`
    with ``pause_at``, writing its progress to ``progress``)."""
    return Path(str(progress) + ".resume")


def resume_reader(progress: str | Path) -> None:
    """Let the reader that writes its progress to ``progress`` read on past its pause."""
    resume_file(progress).touch()


def kill_and_wait(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL ``pid``, then wait (at most ``timeout`` seconds) until it is gone or a zombie."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state == "Z":
            return
        time.sleep(0.02)


def check_across_restart(old: dict[int, list[int]], new: dict[int, list[int]], totals: Sequence[int]) -> int:
    """A receiver's service was killed and a new reader took over: per sending socket i the old reader got
    0..k-1 in order and the new one first..totals[i]-1 in order with first >= k (nothing twice, nothing out
    of order); AssertionError otherwise. Returns the messages that died with the killed service (sum of
    first - k)."""
    lost = 0
    for i, total in enumerate(totals):
        k = len(old[i])
        assert old[i] == list(range(k)), f"socket {i}: before the kill, not 0..{k - 1} in order"
        first = new[i][0] if new[i] else total
        assert first >= k, f"socket {i}: {k - first} messages delivered twice (before and after the restart)"
        assert new[i] == list(range(first, total)), f"socket {i}: after, not {first}..{total - 1} in order"
        lost += first - k
    return lost


def check_prefix_of_told(got: dict[int, list[int]], told: Sequence[int]) -> int:
    """A sender's service was killed: per socket i the survivor got an in-order prefix of what the sender was
    told was sent (told[i]); AssertionError otherwise. Returns how many of those died with the service."""
    lost = 0
    for i, sent in enumerate(told):
        k = len(got[i])
        assert got[i] == list(range(k)), f"socket {i}: before the kill, not 0..{k - 1} in order"
        assert k <= sent, f"socket {i}: more received than the sender was told were sent"
        lost += sent - k
    return lost


#: refuses new TCP connections (a SYN without ACK) to the given ports with a reset; established ones pass (a
#: reject of every segment would reset the survivor's live connections first: docs/userspace.md, "Restart")
_GATE = """table inet pyrds_restart_gate {{
 chain in {{
  type filter hook input priority 0; policy accept;
  tcp dport {{ {ports} }} tcp flags & (syn | ack) == syn reject with tcp reset
 }}
}}
"""


def gate(netns_name: str, ports: Iterable[int], closed: bool) -> None:
    """Refuse (RST) new TCP connections to ``ports`` in network namespace ``netns_name``, or admit them
    again: a restarted node stays closed until its new reader is bound."""
    from pyrds import netns

    if closed:
        rules = _GATE.format(ports=", ".join(str(p) for p in sorted(set(ports))))
        netns.run_cmd_in_netns(netns_name, ["nft", "-f", "-"], input=rules)
    else:
        netns.run_cmd_in_netns(netns_name, ["nft", "delete", "table", "inet", "pyrds_restart_gate"])
