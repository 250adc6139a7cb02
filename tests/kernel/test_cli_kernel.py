"""``pyrds ping/info/stress`` on the kernel backend (AF_RDS): run in the VM guest, skipped elsewhere.

Loop transport on 127.0.0.1 and RDS/TCP across the ``tcp_net`` veth (this netns <-> netns ``rdspeer``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrds.testing.helpers import stop_process

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CLI = [sys.executable, "-m", "pyrds.cli.main"]


def run(*args: str, netns: str | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, *args]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=ENV, cwd=ROOT)
        try:
            proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture
def kpassive(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """A kernel-backend ``stress --passive``; param: None (127.0.0.1 here) or the tcp_net peer."""
    where = getattr(request, "param", "loop")
    if where == "tcp":
        net = request.getfixturevalue("tcp_net")
        addr, prefix = net["b4"], ["ip", "netns", "exec", net["peer_ns"]]
    else:
        addr, prefix = "127.0.0.1", []
    port = 4100 + os.getpid() % 1000
    proc = subprocess.Popen(
        [*prefix, *CLI, "stress", "--passive", "--backend", "kernel", "-s", addr, "-p", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert f"passive on {addr}:{port} (kernel backend)" in line, line
    yield addr, port
    stop_process(proc)


def test_ping_loopback() -> None:
    proc = run("ping", "--backend", "kernel", "-c", "3", "-i", "0.1", "127.0.0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(kernel backend)" in proc.stdout
    assert "3 pings sent, 3 replies received, 0% loss" in proc.stdout


def test_ping_over_tcp(tcp_net: dict[str, str]) -> None:
    proc = run(
        "ping", "--backend", "kernel", "-c", "3", "-i", "0.2", "-W", "10", "-I", tcp_net["a4"], tcp_net["b4"]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 replies received" in proc.stdout
    assert sum(1 for ln in proc.stdout.splitlines() if f"from {tcp_net['b4']}" in ln) == 3


def test_ping_nothing_answering(tcp_net: dict[str, str]) -> None:
    proc = run("ping", "--backend", "kernel", "-c", "2", "-i", "0.2", "-W", "1", "10.78.0.99")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 pings sent, 0 replies received, 100% loss" in proc.stdout


def test_info_tables_and_json(tcp_net: dict[str, str]) -> None:
    assert run("ping", "--backend", "kernel", "-c", "1", "-W", "10", tcp_net["b4"]).returncode == 0
    proc = run("info", "--backend", "kernel")
    assert proc.returncode == 0, proc.stderr
    for title in ("Counters:", "RDS Sockets:", "RDS Connections:", "TCP Connections:", "Retransmit Queue:"):
        assert title in proc.stdout
    assert "send_pong" in proc.stdout or "recv_ping" in proc.stdout
    proc = run("info", "--backend", "kernel", "-c", "-n", "-t", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "kernel"
    assert any(c["name"] == "recv_ping" for c in doc["counters"])
    conns = [c for c in doc["connections"] if c["faddr"] == tcp_net["b4"]]
    assert conns and conns[0]["transport"] == "tcp", doc["connections"]
    assert isinstance(doc["tcp_sockets"], list) and doc["tcp_sockets"], doc
    proc6 = run("info", "--backend", "kernel", "-6", "-k", "-n", "--json")
    assert proc6.returncode == 0, proc6.stderr
    json.loads(proc6.stdout)


@pytest.mark.parametrize("kpassive", ["loop", "tcp"], indirect=True)
@pytest.mark.parametrize("mode", ["--rr", "--one-way"])
def test_stress(kpassive: tuple[str, int], mode: str, request: pytest.FixtureRequest) -> None:
    addr, port = kpassive
    local = "127.0.0.1" if addr == "127.0.0.1" else request.getfixturevalue("tcp_net")["a4"]
    proc = run(
        "stress",
        "--backend",
        "kernel",
        "-s",
        local,
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
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "kernel" and doc["messages"] > 0 and doc["msgs_per_s"] > 0, doc
    assert doc["errors"] == []
    if mode == "--rr":
        assert doc["rtt_us"]["p50"] > 0
