"""pyrds.testing.workloads pieces that need no socket: the watchdog and the mainline selftest's pattern."""

from __future__ import annotations

import pytest

from pyrds.testing import workloads
from pyrds.testing.workloads import Watchdog, mainline_plan


def test_watchdog_tells_a_stall_from_a_slow_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(workloads.time, "monotonic", lambda: clock[0])
    dog = Watchdog(timeout=600, stall=45)
    for step in range(20):  # slow but moving: 30 s per message, 600 s in all, never a stall
        clock[0] += 30
        assert dog.why_stop(step) is None
    dog = Watchdog(timeout=600, stall=45)
    assert dog.why_stop(1) is None
    clock[0] += 44
    assert dog.why_stop(1) is None
    clock[0] += 2
    assert dog.why_stop(1) == "stalled: nothing for 45s"
    dog = Watchdog(timeout=10, stall=None)
    clock[0] += 11
    assert dog.why_stop(5) == "not done after 10s"


def test_mainline_pattern() -> None:
    plan = mainline_plan(12)
    assert plan[:6] == [(0, 1), (1, 0), (0, 1), (1, 1), (0, 0), (1, 1)]
    assert plan[6:] == plan[:6]


def test_ranges_names_missing_messages_as_runs() -> None:
    from pyrds.testing.workloads import _ranges

    assert _ranges([5, 1, 2, 3, 9, 10]) == "1-3,5,9-10"
    assert _ranges([]) == ""
    assert _ranges(range(0, 40, 2), limit=3) == "0,2,4,... (17 more runs)"


# ------------------------------------------------------------------------------------------ socket selftest


def test_selftest_plan_is_deterministic_and_crosses_nodes() -> None:
    from pyrds.testing.workloads import selftest_plan

    plan = selftest_plan(3000, [3, 2], seed=5)
    assert plan == selftest_plan(3000, [3, 2], seed=5)
    assert plan != selftest_plan(3000, [3, 2], seed=6)
    node = [0, 0, 0, 1, 1]
    assert all(node[m.sender] != node[m.receiver] for m in plan)
    # every socket sends to, and hears from, every socket of the other node
    pairs = {(m.sender, m.receiver) for m in plan}
    assert pairs == {(s, r) for s in range(5) for r in range(5) if node[s] != node[r]}
    # per pair, the ordinals count 0, 1, 2, ... in plan order
    seen: dict[tuple[int, int], int] = {}
    for m in plan:
        assert m.ordinal == seen.get((m.sender, m.receiver), 0)
        seen[(m.sender, m.receiver)] = m.ordinal + 1


def test_selftest_sizes_span_ib_fragments() -> None:
    from pyrds.testing.workloads import SELFTEST_HEADER, SELFTEST_MAX, selftest_plan

    sizes = [m.size for m in selftest_plan(3000, [2, 2], seed=1)]
    assert min(sizes) >= SELFTEST_HEADER.size and max(sizes) <= SELFTEST_MAX
    frags = {-(-s // 4096) for s in sizes}
    assert frags == {1, 2, 3, 4}  # RDS/IB fragments of 4096 bytes: one to four
    assert {4095, 4096, 4097} <= set(sizes)  # the fragment boundary itself
    assert sum(s <= 256 for s in sizes) > len(sizes) // 3  # mostly small: many messages, not many bytes


def test_selftest_plan_needs_two_nodes_with_sockets() -> None:
    from pyrds.testing.workloads import selftest_plan

    with pytest.raises(ValueError):
        selftest_plan(10, [3], seed=1)
    with pytest.raises(ValueError):
        selftest_plan(10, [2, 0], seed=1)


def test_selftest_payload_carries_number_and_ordinal() -> None:
    from pyrds.testing.workloads import SELFTEST_HEADER, selftest_payload, selftest_plan, selftest_pool

    pool = selftest_pool(3)
    plan = selftest_plan(200, [2, 2], seed=3)
    payloads = [selftest_payload(pool, n, m) for n, m in enumerate(plan)]
    for n, (m, data) in enumerate(zip(plan, payloads, strict=True)):
        assert len(data) == m.size
        assert SELFTEST_HEADER.unpack_from(data) == (n, m.ordinal)
    assert len(set(payloads)) == len(payloads)
    assert selftest_payload(pool, 7, plan[7]) == payloads[7]


def test_pair_ledger_and_mismatches() -> None:
    from pyrds.testing.workloads import PairLedger, ledger_mismatches

    msgs = [b"one", b"two", b"three"]
    sent, same, swapped, joined = PairLedger(), PairLedger(), PairLedger(), PairLedger()
    for m in msgs:
        sent.add("A0->B0", m)
        same.add("A0->B0", m)
    for m in (msgs[1], msgs[0], msgs[2]):
        swapped.add("A0->B0", m)
    for m in (b"one" + b"two", b"", b"three"):  # same bytes, same count, other boundaries
        joined.add("A0->B0", m)
    want = {"A0->B0": 3}
    assert ledger_mismatches(want, sent.summary(), same.summary()) == []
    assert "reordered" in ledger_mismatches(want, sent.summary(), swapped.summary())[0]
    assert "reordered" in ledger_mismatches(want, sent.summary(), joined.summary())[0]
    short = PairLedger()
    short.add("A0->B0", b"one")
    assert ledger_mismatches(want, sent.summary(), short.summary()) == ["A0->B0: received 1 of 3"]
    assert ledger_mismatches({**want, "B0->A0": 1}, sent.summary(), same.summary()) == ["B0->A0: sent 0 of 1"]
    assert sent.summary()["A0->B0"][0] == 3


def test_selftest_receiver_names_the_first_bad_message() -> None:
    from pyrds.testing.workloads import (
        SelftestReceiver,
        pair_name,
        selftest_payload,
        selftest_plan,
        selftest_pool,
        socket_names,
    )

    names = socket_names([1, 1])
    assert names == ["A0", "B0"]
    pool = selftest_pool(1)
    plan = selftest_plan(40, [1, 1], seed=1)
    to_b = [n for n, m in enumerate(plan) if m.receiver == 1]
    rx = SelftestReceiver(plan, [1], names, pool)
    assert rx.expected == len(to_b) and not rx.done
    assert rx.missing() == {"A0->B0": f"0 of {len(to_b)}, next n={to_b[0]}"}
    first, second = (selftest_payload(pool, n, plan[n]) for n in to_b[:2])
    rx.got(0, 1, second)  # the first one lost (or overtaken)
    rx.got(0, 1, first)
    changed = bytearray(selftest_payload(pool, to_b[2], plan[to_b[2]]))
    changed[-1] ^= 1
    rx.got(0, 1, bytes(changed))
    assert rx.bad == 3 and rx.total == 3
    assert rx.problems[0].startswith(f"A0->B0: message 1 (n={to_b[0]}, ")
    assert f"got n={to_b[1]} (its message 2)" in rx.problems[0]
    assert f"changed from offset {len(changed) - 1}" in rx.problems[2]
    rest = SelftestReceiver(plan, [1], names, pool)
    for n in to_b:
        rest.got(0, 1, selftest_payload(pool, n, plan[n]))
    assert rest.done and rest.bad == 0 and rest.missing() == {}
    rest.got(0, 1, first)  # one more than planned
    assert rest.bad == 1 and "the plan has" in rest.problems[0]
    assert list(rest.ledger.summary()) == [pair_name(names, 0, 1)]


class _UnixRds:
    """An AF_UNIX datagram socket dressed as a bound RDS socket (addresses ``(ip, port)``): reliable, ordered
    and EAGAIN when the peer's queue is full, so :func:`socket_selftest` runs without AF_RDS."""

    names: dict[bytes, tuple[str, int]] = {}

    def __init__(self, tag: str, ip: str, port: int) -> None:
        import socket

        self.tag, self.addr = tag, (ip, port)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self._path(self.addr))
        self.names[self._path(self.addr)] = self.addr
        self.sends = 0

    def _path(self, addr: tuple[str, int]) -> bytes:
        return f"\0pyrds-selftest-{self.tag}-{addr[0]}-{addr[1]}".encode()

    def getsockname(self) -> tuple[str, int]:
        return self.addr

    def fileno(self) -> int:
        return self.sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self.sock.setblocking(flag)

    def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
        n = self.sock.sendto(data, self._path(addr))
        self.sends += 1
        return n

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, tuple[str, int]]:
        data, path = self.sock.recvfrom(bufsize, flags)
        return data, self.names[path]

    def close(self) -> None:
        self.sock.close()


class _DuplicatingRds(_UnixRds):
    def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
        n = super().sendto(data, addr)
        if self.sends == 5:  # the fifth message goes out twice
            super().sendto(data, addr)
        return n


def _run_selftest(
    nodes: list[list[_UnixRds]], count: int, **kw: float
) -> list[dict[str, object] | BaseException]:
    import threading

    from pyrds.testing.workloads import socket_selftest

    addrs = [[s.getsockname() for s in node] for node in nodes]
    out: list[dict[str, object] | BaseException] = [RuntimeError("not run")] * len(nodes)

    def run(i: int) -> None:
        try:
            out[i] = socket_selftest(nodes[i], me=i, addrs=addrs, count=count, seed=9, **kw)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for node in nodes:
        for s in node:
            s.close()
    return out


def test_socket_selftest_over_datagram_sockets() -> None:
    """The whole socket loop (epoll, bursts, EAGAIN retries: a unix datagram queue holds few messages),
    two nodes of 2 and 3 sockets: both ledgers agree pair by pair."""
    import uuid

    from pyrds.testing.workloads import ledger_mismatches, plan_counts, selftest_plan, socket_names

    tag = uuid.uuid4().hex[:8]
    nodes = [
        [_UnixRds(tag, "10.0.0.1", 100 + j) for j in range(2)],
        [_UnixRds(tag, "10.0.0.2", 200 + j) for j in range(3)],
    ]
    ra, rb = _run_selftest(nodes, 600, stall=20.0, timeout=60.0)
    assert isinstance(ra, dict) and isinstance(rb, dict), (ra, rb)
    names = socket_names([2, 3])
    want = plan_counts(selftest_plan(600, [2, 3], 9), names)
    sent = {**ra["sent"], **rb["sent"]}  # type: ignore[dict-item]
    recv = {**ra["recv"], **rb["recv"]}  # type: ignore[dict-item]
    assert ledger_mismatches(want, sent, recv) == []
    assert ra["recv_total"] + rb["recv_total"] == 600  # type: ignore[operator]
    assert ra["bad"] == rb["bad"] == 0 and ra["strangers"] == rb["strangers"] == 0
    assert ra["node"] == "A" and rb["node"] == "B"


def test_socket_selftest_catches_a_duplicate_and_a_stall() -> None:
    import uuid

    from pyrds.testing.workloads import (
        ledger_mismatches,
        plan_counts,
        selftest_plan,
        socket_names,
        socket_selftest,
    )

    tag = uuid.uuid4().hex[:8]
    nodes = [[_DuplicatingRds(tag, "10.0.0.1", 1)], [_UnixRds(tag, "10.0.0.2", 2)]]
    ra, rb = _run_selftest(nodes, 60, stall=20.0, timeout=60.0)
    assert isinstance(ra, dict) and isinstance(rb, dict), (ra, rb)
    want = plan_counts(selftest_plan(60, [1, 1], 9), socket_names([1, 1]))
    sent = {**ra["sent"], **rb["sent"]}  # type: ignore[dict-item]
    problems = ledger_mismatches(want, sent, {**ra["recv"], **rb["recv"]})  # type: ignore[dict-item]
    assert problems and problems[0].startswith("A0->B0: "), problems
    assert rb["bad"] and "A0->B0: message 6 " in rb["problems"][0]  # type: ignore[index]
    # node B alone: nothing ever comes from A, so B stalls (and says what it misses)
    tag = uuid.uuid4().hex[:8]
    lonely = [[_UnixRds(tag, "10.0.0.1", 1)], [_UnixRds(tag, "10.0.0.2", 2)]]
    addrs = [[s.getsockname() for s in node] for node in lonely]
    with pytest.raises(TimeoutError, match=r"node B: stalled: nothing for 0.5s: .*short: \{'A0->B0': '0 of "):
        socket_selftest(lonely[1], me=1, addrs=addrs, count=20, seed=9, stall=0.5, timeout=30.0)
    for node in lonely:
        for s in node:
            s.close()


def test_stress_passive_serves_a_stress_client_until_stopped() -> None:
    """The agent job behind the benchmark's kernel->userspace RDS/IB row: ``pyrds stress --passive``'s loop on
    a socket it was given (a UDP socket here: same recvmsg/sendto shape), ended by stress_passive_stop; it
    returns the client runs that finished. Bad bounds are ValueErrors before anything is served."""
    import socket
    import threading

    from pyrds.cli.stress_proto import control, parse_control
    from pyrds.testing.workloads import stress_passive, stress_passive_stop

    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        srv.bind(("127.0.0.1", 0))
        cli.bind(("127.0.0.1", 0))
        cli.settimeout(10)
        for bad in ({"seconds": 0}, {"seconds": "5"}, {"seconds": 7201}, {"seconds": 5, "sockbuf": -1}):
            with pytest.raises(ValueError):
                stress_passive([srv], **bad)
        assert stress_passive_stop([srv]) is False  # nothing serves it yet
        result: list[int] = []
        th = threading.Thread(
            target=lambda: result.append(stress_passive([srv], seconds=60, sockbuf=1 << 16))
        )
        th.start()
        there = srv.getsockname()
        cli.sendto(control("hello", mode="rr", ack=3, size=10), there)
        assert (parse_control(cli.recv(4096)) or {}).get("op") == "ready"
        cli.sendto(bytes(10), there)
        assert cli.recv(4096) == bytes(3)  # the rr reply of the ack size
        cli.sendto(control("fin"), there)
        done = parse_control(cli.recv(4096)) or {}
        assert (done.get("op"), done.get("received"), done.get("bytes")) == ("done", 1, 10)
        assert stress_passive_stop([srv]) is True
        th.join(10)
        assert not th.is_alive() and result == [1]
        assert stress_passive_stop([srv]) is False
        assert stress_passive([srv], seconds=0.3) == 0  # its own deadline ends it
    finally:
        srv.close()
        cli.close()
