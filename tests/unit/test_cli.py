"""``pyrds ping/info/stress`` run as a user would (subprocesses) on the userspace backend, on this host.

Addresses are 127.0.0.1 (loop transport); the "nothing answers" ping goes into a namespace this test creates.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrds.testing.helpers import stop_process

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CLI = [sys.executable, "-m", "pyrds.cli.main"]


def run_captured(
    argv: list[str], timeout: float = 60.0, netns: str | None = None, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run to exit with output in files, not pipes: a userspace stack service the command starts inherits
    them and outlives the command, so waiting for pipe EOF would wait for the service. ``popen`` overrides
    Popen's arguments (env, cwd, user, ...)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        kw: dict[str, Any] = {"stdout": out, "stderr": err, "text": True, "env": ENV, "cwd": ROOT, **popen}
        if netns is None:
            proc = subprocess.Popen(argv, **kw)
        else:
            from pyrds.netns import popen_in_netns

            proc = popen_in_netns(netns, argv, **kw)
        try:
            proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())


def pyrds_cmd(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return run_captured([*CLI, *args], timeout)


def free_port() -> int:
    return random.randint(20000, 60000)


def assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout, proc.stdout


@pytest.fixture
def passive() -> Iterator[tuple[str, int]]:
    """A ``stress --passive`` server on 127.0.0.1 (userspace); yields (addr, port), stopped at teardown."""
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "stress", "--passive", "--backend", "userspace", "-s", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "passive on 127.0.0.1" in line, line + (proc.stderr.read() if proc.stderr else "")
    yield "127.0.0.1", port
    stop_process(proc)


# ------------------------------------------------------------------------------------------------- ping


def test_ping_local_stack_answers() -> None:
    proc = pyrds_cmd("ping", "--backend", "userspace", "-c", "3", "-i", "0.1", "127.0.0.1")
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replies = [ln for ln in proc.stdout.splitlines() if "usec" in ln and "from 127.0.0.1" in ln]
    assert len(replies) == 3, proc.stdout
    assert "3 pings sent, 3 replies received, 0% loss" in proc.stdout
    assert "rtt min/avg/max" in proc.stdout


def test_ping_with_explicit_source() -> None:
    proc = pyrds_cmd("ping", "--backend", "userspace", "-c", "1", "-I", "127.0.0.1", "127.0.0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ping_non_local_source_is_a_one_line_error() -> None:
    proc = pyrds_cmd("ping", "--backend", "userspace", "-c", "1", "-I", "192.0.2.77", "127.0.0.1")
    assert_no_traceback(proc)
    assert proc.returncode == 2
    # (lines from a userspace stack service this command started may follow; ours is exactly one line)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("pyrds ")]
    assert len(err) == 1 and "cannot bind to 192.0.2.77" in err[0], proc.stderr


def test_ping_bad_address_and_backend_are_usage_errors() -> None:
    proc = pyrds_cmd("ping", "--backend", "userspace", "-c", "1", "not an address")
    assert_no_traceback(proc)
    assert proc.returncode == 2 and "invalid destination" in proc.stderr
    proc = pyrds_cmd("ping", "--backend", "bogus", "127.0.0.1")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def _can_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root for a network namespace"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "needs pyroute2"
    return None


@pytest.mark.netns
@pytest.mark.skipif(_can_netns() is not None, reason=str(_can_netns()))
def test_ping_nothing_answering_fails_with_summary() -> None:
    from pyrds.netns import netns_pair, run_cmd_in_netns

    # 10.200.0.9 is on the veth subnet but nobody has it: pings go unanswered (traffic stays in our netns)
    with netns_pair("cliping", addr6=None) as pair:
        argv = [*CLI, "ping", "--backend", "userspace", "-c", "2", "-i", "0.2", "-W", "1", "10.200.0.9"]
        done = run_captured(argv, 60, pair.ns_a)
        # stop the stack service our ping started in that namespace before the namespace goes
        pids = run_cmd_in_netns(None, ["ip", "netns", "pids", pair.ns_a], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGTERM)
    proc, out, err = done, done.stdout, done.stderr
    assert "Traceback" not in err, err
    assert proc.returncode == 1, out + err
    assert "2 pings sent, 0 replies received, 100% loss" in out, out
    assert "no reply" in out


# ------------------------------------------------------------------------------------------------- info


def test_info_prints_aligned_tables() -> None:
    pyrds_cmd("ping", "--backend", "userspace", "-c", "1", "127.0.0.1")  # make counters/connections non-empty
    proc = pyrds_cmd("info", "--backend", "userspace")
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    for title in (
        "Counters:",
        "RDS Sockets:",
        "RDS Connections:",
        "Receive Message Queue:",
        "Send Message Queue:",
        "TCP Connections:",
        "Retransmit Queue:",
    ):
        assert title in proc.stdout
    lines = proc.stdout.splitlines()
    start = lines.index("Counters:")
    header = lines[start + 1]
    assert header.split() == ["name", "value"]
    counter_rows = []
    for ln in lines[start + 2 :]:
        if not ln.strip():
            break
        counter_rows.append(ln)
    assert counter_rows, proc.stdout
    # right-aligned values end in the same column as the header
    assert {len(r) for r in counter_rows} == {len(header)}
    assert any(r.split()[0] == "send_pong" for r in counter_rows)
    conn = lines[lines.index("RDS Connections:") + 1 :]
    assert "laddr" in conn[0] and "127.0.0.1" in proc.stdout


def test_info_selected_tables_and_json() -> None:
    proc = pyrds_cmd("info", "--backend", "userspace", "-c", "-n", "--json")
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "userspace"
    assert set(doc) == {"backend", "counters", "connections"}
    assert all(set(c) == {"name", "value"} for c in doc["counters"])
    assert all(isinstance(c["value"], int) for c in doc["counters"])
    for conn in doc["connections"]:
        assert {"laddr", "faddr", "transport", "next_tx_seq"} <= set(conn)


def test_info_v6_json() -> None:
    proc = pyrds_cmd("info", "--backend", "userspace", "-6", "-k", "-n", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc["sockets"], list) and isinstance(doc["connections"], list)


# ----------------------------------------------------------------------------------------------- stress


@pytest.mark.parametrize("mode", ["--rr", "--one-way"])
def test_stress_two_seconds_json(passive: tuple[str, int], mode: str) -> None:
    addr, port = passive
    proc = pyrds_cmd(
        "stress",
        "--backend",
        "userspace",
        "-s",
        addr,
        "-r",
        addr,
        "-p",
        str(port),
        "-T",
        "2",
        "-q",
        "1K",
        mode,
        "--json",
    )
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["mode"] == ("rr" if mode == "--rr" else "oneway")
    assert doc["backend"] == "userspace"
    assert doc["messages"] > 0 and doc["msgs_per_s"] > 0 and doc["mb_per_s"] > 0
    assert doc["errors"] == []
    assert 1.9 <= doc["seconds"] < 30
    if mode == "--rr":
        assert doc["rtt_us"]["p50"] > 0 and doc["rtt_us"]["p99"] >= doc["rtt_us"]["p50"]
    else:
        assert doc["rtt_us"] is None
    # per-second rows went to stderr (not a TTY: plain lines, no carriage returns)
    rows = [ln for ln in proc.stderr.splitlines() if ln.strip() and ln.split()[0][0].isdigit()]
    assert rows and "\r" not in proc.stderr


def test_stress_text_summary_and_rows(passive: tuple[str, int]) -> None:
    addr, port = passive
    proc = pyrds_cmd(
        "stress",
        "--backend",
        "userspace",
        "-r",
        addr,
        "-p",
        str(port),
        "-T",
        "2",
        "-q",
        "0",
        "-d",
        "4",
        "-t",
        "2",
    )
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "tx/s" in out and "MB/s" in out and "rtt us" in out and "cpu %" in out
    assert "pyrds stress summary (userspace backend, rr)" in out
    assert "depth 4  tasks 2" in out
    rate = next(ln for ln in out.splitlines() if "msgs/s" in ln)
    assert float(rate.split("msgs/s")[0].split()[-1]) > 0
    assert "rtt usec:" in out


def test_stress_without_server_fails_cleanly() -> None:
    t0 = time.monotonic()
    proc = pyrds_cmd(
        "stress", "--backend", "userspace", "-r", "127.0.0.1", "-p", str(free_port()), "-T", "1", "-W", "2"
    )
    assert_no_traceback(proc)
    assert proc.returncode == 1
    assert "no stress server answered" in proc.stderr
    assert time.monotonic() - t0 < 30


def test_stress_usage_errors() -> None:
    proc = pyrds_cmd("stress", "--backend", "userspace", "-r", "127.0.0.1", "-q", "2M")
    assert proc.returncode == 2 and "size must be" in proc.stderr
    proc = pyrds_cmd("stress", "--backend", "userspace", "-r", "127.0.0.1", "--one-way", "-a", "10")
    assert proc.returncode == 2 and "ack-size" in proc.stderr
    assert_no_traceback(proc)


def test_main_in_process_help(capsys: pytest.CaptureFixture[str]) -> None:
    from pyrds.cli.main import main

    assert main(["--help"]) == 0
    assert "ping" in capsys.readouterr().out
    assert main([]) == 2
