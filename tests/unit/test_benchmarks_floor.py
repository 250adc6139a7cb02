"""benchmarks/floor.py and its report section: the relay carries every message whole and in order both ways
(a floor that lost or merged messages would flatter the process structure), and the report's ratios are the
best rate of each kind against the others."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.unit.benchlib import bench_modules


def test_relay_carries_messages_whole_and_in_order_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two relays in this namespace (the TCP port and unix names made unique), a client of each: sizes
    from 0 to 200 KiB go across both ways, each one whole, in order, with flow control on the way (the
    receiving client reads only after everything was sent)."""
    with bench_modules(["floor"], ["topology"]) as mods:
        floor = mods["floor"]
        tag = uuid.uuid4().hex[:8]
        monkeypatch.setattr(floor, "RELAY_TCP_PORT", 20000 + int(tag[:4], 16) % 20000)
        names = (tag + "b", tag + "a")
        for name, listen in zip(names, (True, False), strict=True):
            threading.Thread(target=floor.cmd_relay, args=(name, listen, "127.0.0.1"), daemon=True).start()
        _exchange_both_ways(_connect(floor, names[1]), _connect(floor, names[0]))


def test_compiled_relay_carries_messages_whole_and_in_order_both_ways() -> None:
    """benchmarks/relay.c, built by floor.relay_c_binary, under the same traffic as the Python relay: two
    relay processes in this namespace (unique port and unix names), sizes 0 to 200 KiB both ways, each whole
    and in order, the receiver reading only after everything was sent (flow control on the way)."""
    with bench_modules(["floor"], ["topology"]) as mods:
        floor = mods["floor"]
        binary = floor.relay_c_binary()
        if binary is None:
            pytest.skip("no C compiler: floor.py measures no relay-c rows here either")
        home = os.stat(os.path.dirname(binary))  # never a path in /tmp another user could have placed
        assert home.st_uid == os.getuid() and home.st_mode & 0o077 == 0
        assert floor.relay_c_binary() == binary  # built once per process
        tag = uuid.uuid4().hex[:8]
        port = str(20000 + (int(tag[:4], 16) + 7919) % 20000)
        names = (tag + "b", tag + "a")
        procs = [
            subprocess.Popen([binary, names[0], "listen", "-", port], stdout=subprocess.PIPE, text=True),
        ]
        try:
            assert procs[0].stdout is not None and procs[0].stdout.readline().strip() == "ready"
            procs.append(
                subprocess.Popen([binary, names[1], "connect", "127.0.0.1", port], stdout=subprocess.PIPE)
            )
            _exchange_both_ways(_connect(floor, names[1]), _connect(floor, names[0]))
            for p in procs:  # a client gone: the relay exits by itself
                assert p.wait(10) == 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def test_compiled_relay_stack_mode_adds_the_readiness_byte_per_delivery() -> None:
    """relay.c's ``stack`` mode (the ``relay-c-stack`` row): each client gets a readiness fd as the first
    packet's descriptor, the same traffic goes across whole and in order (the 48-byte header's sequence
    is checked by the receiving relay, which would exit 3), and each client's fd holds one byte per message
    delivered to it."""
    with bench_modules(["floor"], ["topology"]) as mods:
        floor = mods["floor"]
        binary = floor.relay_c_binary()
        if binary is None:
            pytest.skip("no C compiler: floor.py measures no relay-c rows here either")
        tag = uuid.uuid4().hex[:8]
        port = str(20000 + (int(tag[:4], 16) + 4099) % 20000)
        names = (tag + "b", tag + "a")
        procs = [
            subprocess.Popen(
                [binary, names[0], "listen", "-", port, "stack"], stdout=subprocess.PIPE, text=True
            )
        ]
        readies: list[socket.socket] = []
        try:
            assert procs[0].stdout is not None and procs[0].stdout.readline().strip() == "ready"
            procs.append(
                subprocess.Popen(
                    [binary, names[1], "connect", "127.0.0.1", port, "stack"], stdout=subprocess.PIPE
                )
            )
            a, b = _connect(floor, names[1]), _connect(floor, names[0])
            readies = [floor._readiness_fd(a), floor._readiness_fd(b)]
            for r in readies:
                r.settimeout(20)
            messages = _exchange_both_ways(a, b)
            for r in readies:  # one byte per message each client received
                got = 0
                while got < messages:
                    chunk = r.recv(4096)
                    assert chunk, "the relay closed the readiness fd early"
                    got += len(chunk)
                assert got == messages
            for p in procs:
                assert p.wait(10) == 0
        finally:
            for r in readies:
                r.close()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def test_floor_refuses_unknown_kinds() -> None:
    with bench_modules(["floor"], ["topology"]) as mods:
        with pytest.raises(ValueError, match="unknown kinds: relay-x"):
            mods["floor"].measure(1.0, 1, ["kernel", "relay-x"])


def _exchange_both_ways(a: socket.socket, b: socket.socket) -> int:
    """Sizes from 0 to 200 KiB from a to b, then from b to a: each one whole, in order, the receiver
    reading only after everything was sent (so the relays' flow control is on the way). Closes both;
    returns how many messages went each way."""
    sizes = [0, 1, 4, 1024, 65536, 200 * 1024, 7, 0, 3000] * 20
    try:
        for sender, receiver in ((a, b), (b, a)):
            sent = [struct.pack("!I", i) + bytes([i % 251]) * max(0, n - 4) for i, n in enumerate(sizes)]
            feeder = threading.Thread(target=lambda s=sender, m=sent: [s.send(x) for x in m])
            feeder.start()
            time.sleep(0.2)
            got = [receiver.recv(1 << 18) for _ in sent]
            feeder.join(10)
            assert got == sent
    finally:
        a.close()
        b.close()
    return len(sizes)


def _connect(floor: Any, name: str) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(floor._unix_name(name))
            s.settimeout(20)
            return s
        except OSError:
            s.close()
            assert time.monotonic() < deadline, f"relay {name} not listening"
            time.sleep(0.05)


def test_report_floor_section_ratios(tmp_path: Path) -> None:
    with bench_modules(["report"]) as mods:
        report = mods["report"]
        rows = [
            {"kind": "kernel", "mode": "rr", "size": 1024, "rep": 0, "msgs_per_s": 1500.0},
            {"kind": "kernel", "mode": "rr", "size": 1024, "rep": 1, "msgs_per_s": 1600.0},
            {"kind": "relay", "mode": "rr", "size": 1024, "rep": 0, "msgs_per_s": 320.0},
            {"kind": "userspace", "mode": "rr", "size": 1024, "rep": 0, "msgs_per_s": 160.0},
            {"kind": "kernel", "mode": "oneway", "size": 65536, "rep": 0, "msgs_per_s": 650.0},
            {"kind": "relay", "mode": "oneway", "size": 65536, "rep": 0, "msgs_per_s": 585.0},
            {"kind": "userspace", "mode": "oneway", "size": 65536, "rep": 0, "msgs_per_s": 130.0},
        ]
        text = "\n".join(
            report._floor_section({"date": "d", "machine": "m", "repeat": 2, "seconds": 4.0, "rows": rows})
        )
        assert "| request/response 1 KiB | 1,600 | 320 | 160 | 0.20x | 0.10x | 0.50x |" in text
        assert "| one-way 64 KiB | 650 | 585 | 130 | 0.90x | 0.20x | 0.22x |" in text
        assert "relay-c" not in text  # no compiled relay measured: the table of before
        assert "Not measured" in "\n".join(report._floor_section(None))
        rows += [
            {"kind": "relay-c", "mode": "rr", "size": 1024, "rep": 0, "msgs_per_s": 800.0},
            {"kind": "relay-c", "mode": "oneway", "size": 65536, "rep": 0, "msgs_per_s": 620.0},
        ]
        sec = {"date": "d", "machine": "m", "repeat": 2, "seconds": 4.0, "rows": rows}
        lines = report._floor_section(sec)
        head = next(line for line in lines if line.startswith("| cell |"))
        assert head.count("|") == 11 and "| relay-c msgs/s |" in head
        assert head.endswith("userspace / relay-c |")
        rr = "| request/response 1 KiB | 1,600 | 320 | 800 | 160 | 0.20x | 0.50x | 0.10x | 0.50x | 0.20x |"
        assert rr in lines
        assert "| one-way 64 KiB | 650 | 585 | 620 | 130 | 0.90x | 0.95x | 0.20x | 0.22x | 0.21x |" in lines
        assert lines[lines.index(head) + 1].count("|") == 11


def test_merge_keeps_the_floor_when_not_measured(tmp_path: Path) -> None:
    with bench_modules(["run"], ["cells", "report", "topology"]) as mods:
        run = mods["run"]
        old = tmp_path / "results.json"
        old.write_text('{"results": [], "percall": [], "floor": {"rows": [1]}}')
        merged = run.merge({"results": [], "percall": []}, old, ["stress"])
        assert merged["floor"] == {"rows": [1]}
        assert "floor" not in run.merge({"results": [], "percall": []}, old, ["stress", "floor"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces)")
def test_floor_measures_relay_and_userspace_rows() -> None:
    """The driver on a host without AF_RDS: relay and userspace rows of both cells, each with a rate."""
    with bench_modules(["floor"], ["topology"]) as mods:
        rows = mods["floor"].measure(0.5, 1, ["relay", "userspace"])
    cells = {(r["kind"], r["mode"], r["size"]) for r in rows}
    assert cells == {
        ("relay", "rr", 1024),
        ("userspace", "rr", 1024),
        ("relay", "oneway", 65536),
        ("userspace", "oneway", 65536),
    }
    assert all(r["msgs_per_s"] > 0 for r in rows)
