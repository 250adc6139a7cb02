"""System calls the service spends per request/response message (issue 10): a lone POST notice is not
followed by a control read that only says EAGAIN, and an RDS/TCP connection whose bytes were all known
acked is not asked SIOCOUTQ again right after it wrote (only the bytes just written could show, and TCP
acks them later); the readiness fd's delivery check does not poll twice in a row."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from pyrds.constants import InfoType
from pyrds.userspace.control import stack_counters
from pyrds.userspace.service import readiness

ROUND_TRIPS = 300


def _round_trips(a: Any, b: Any, n: int) -> None:
    a_addr, b_addr = a.getsockname(), b.getsockname()
    for i in range(n):
        msg = b"q%d" % i
        a.sendto(msg, b_addr)
        assert b.recv(100) == msg
        b.sendto(b"r%d" % i, a_addr)
        assert a.recv(100) == b"r%d" % i


def _counts_per_side(pair: Any, names: tuple[str, ...]) -> tuple[Any, Any, list[tuple[str, dict[str, int]]]]:
    """A bound socket on each node, and what each stack (A, B) counted of ``names`` during ROUND_TRIPS
    round trips between them, after 5 that get the grants (every later send is posted)."""
    a, b = pair.bound_pair()
    _round_trips(a, b, 5)
    before = stack_counters(a), stack_counters(b)
    _round_trips(a, b, ROUND_TRIPS)
    after = stack_counters(a), stack_counters(b)
    counts = [
        (side, {name: now[name] - was[name] for name in names})
        for side, was, now in zip("AB", before, after, strict=True)
    ]
    return a, b, counts


@pytest.mark.netns
def test_request_response_costs_no_empty_control_reads(userspace_netns_pair: Any) -> None:
    _a, _b, per_side = _counts_per_side(userspace_netns_pair, ("send_posted", "control_reads_empty"))
    for side, counts in per_side:
        posted, empty = counts["send_posted"], counts["control_reads_empty"]
        print(f"stack {side}: {posted} posted sends, {empty} empty control reads")
        assert posted >= ROUND_TRIPS // 2, "the sends should be posted notices"
        # one per notice before (each POST read was followed by a read that said EAGAIN)
        assert empty < ROUND_TRIPS // 4


@pytest.mark.netns
def test_request_response_asks_tcp_for_acks_about_once_per_round_trip(userspace_netns_pair: Any) -> None:
    a, b, per_side = _counts_per_side(userspace_netns_pair, ("tcp_ack_checks",))
    for side, counts in per_side:
        checks = counts["tcp_ack_checks"]
        print(f"stack {side}: {checks} SIOCOUTQ for {ROUND_TRIPS} round trips")
        # two per round trip before (after the write, and after the read); ack-poll timers add a few
        assert checks < ROUND_TRIPS * 3 // 2
    # and what is sent is still released once acked: nothing stays unacked (retransmit queue) on either node
    retrans = InfoType.RDS_INFO_RETRANS_MESSAGES
    deadline = time.monotonic() + 5
    while a.get_info(retrans) or b.get_info(retrans):
        assert time.monotonic() < deadline, "sent messages were never released"
        time.sleep(0.02)


class _CountingPoll:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def poll(self, timeout: int) -> Any:
        self.calls += 1
        return self.inner.poll(timeout)


def test_delivery_check_of_a_byte_already_taken_asks_tcp_info_first() -> None:
    """The byte was sent and the client already took it (A is not readable): A's byte count says it was
    delivered, with no second poll of A (that poll could only repeat the caller's)."""
    r = readiness.Readiness()
    try:
        if not r.tcp:
            pytest.skip("no TCP readiness pair in this namespace")
        r.b.send(b"r", socket.MSG_DONTWAIT)
        r.sent += 1
        r.a.settimeout(5)
        assert r.a.recv(10) == b"r"  # what the client does after reading the tail of its channel
        counting = _CountingPoll(r._pollin)
        r._pollin = counting  # type: ignore[assignment]
        r._await_delivery()
        assert counting.calls == 0
    finally:
        r.close()


def test_a_readiness_byte_is_not_checked_for_delivery_when_sent() -> None:
    """Making the fd readable is one send: its delivery is checked later, before anything depends on it
    (request/response: a poll of A and a TCP_INFO per message before)."""
    r = readiness.Readiness()
    try:
        if not r.tcp:
            pytest.skip("no TCP readiness pair in this namespace")
        counting = _CountingPoll(r._pollin)
        r._pollin = counting  # type: ignore[assignment]
        r.set_readable(True)
        assert counting.calls == 0
        assert r.unconfirmed
    finally:
        r.close()


def test_a_byte_the_client_says_it_took_needs_no_delivery_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's report page counts every byte sent as taken: it arrived, no system call asks."""
    r = readiness.Readiness()
    try:
        if not r.tcp:
            pytest.skip("no TCP readiness pair in this namespace")
        r.set_readable(True)
        r.a.settimeout(5)
        assert r.a.recv(10) == b"r"  # the client empties A after reading the tail of its channel
        counting = _CountingPoll(r._pollin)
        r._pollin = counting  # type: ignore[assignment]
        asked: list[int] = []
        monkeypatch.setattr(r, "_await_delivery", lambda: asked.append(1))
        r.delivered(client_taken=1)
        assert (counting.calls, asked, r.unconfirmed) == (0, [], False)
    finally:
        r.close()


def test_an_unconfirmed_byte_is_checked_before_the_fd_changes_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the client's word the check is the old one (A's POLLIN, then its byte count), done once, at
    the next change of the fd: a byte read back must have arrived."""
    r = readiness.Readiness()
    try:
        if not r.tcp:
            pytest.skip("no TCP readiness pair in this namespace")
        r.set_readable(True)
        counting = _CountingPoll(r._pollin)
        r._pollin = counting  # type: ignore[assignment]
        r.set_readable(False)
        assert counting.calls == 1 and not r.unconfirmed
        assert r.taken == 1  # the byte was there to be read back
        r.delivered()
        assert counting.calls == 1  # nothing left to confirm
    finally:
        r.close()


def test_every_byte_is_confirmed_before_the_service_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """confirm_all (called before every reply) checks each fd whose byte is unconfirmed, once, and forgets
    them: a receiver a local send made readable is readable when the sender's send returns."""
    pairs = [readiness.Readiness(), readiness.Readiness()]
    try:
        if not all(r.tcp for r in pairs):
            pytest.skip("no TCP readiness pair in this namespace")
        for r in pairs:
            r.set_readable(True)
        checked: list[readiness.Readiness] = []
        for r in pairs:
            monkeypatch.setattr(r, "_a_readable", lambda ms, r=r: checked.append(r) or True)
        readiness.confirm_all()
        assert sorted(map(id, checked)) == sorted(map(id, pairs))
        assert not any(r.unconfirmed for r in pairs)
        readiness.confirm_all()
        assert len(checked) == 2  # nothing left to check
    finally:
        for r in pairs:
            r.close()
    assert not readiness._unconfirmed  # a closed fd is forgotten
