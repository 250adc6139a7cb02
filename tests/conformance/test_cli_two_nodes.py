"""``pyrds ping``, ``pyrds info`` and ``pyrds stress`` run as a user would (subprocesses in each node's
namespace) across RDS/TCP between two namespaces, on every pairing: kernel, userspace and mixed.

In the guest the kernel pairings use AF_RDS and the mixed ones put a kernel node and a userspace node on one
wire; on a host without AF_RDS only the userspace pairing runs (the others are reported as skipped).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pyrds.constants import RDS_TCP_PORT
from pyrds.netns import popen_in_netns
from pyrds.testing.helpers import stop_process

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "pyrds.cli.main"]


def _env(node) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if node.tcp_port != RDS_TCP_PORT:  # a userspace node beside the kernel's rds_tcp (see topology)
        env["PYRDS_TCP_PORT"] = str(node.tcp_port)
    return env


def spawn_cli(node, *args: str) -> subprocess.Popen[str]:
    """``pyrds ARGS`` started inside the node's namespace with the node's environment."""
    return popen_in_netns(
        node.netns,
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(node),
        cwd=ROOT,
    )


def run_cli(node, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    proc = spawn_cli(node, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert "Traceback" not in err, err
    return done


@contextmanager
def passive_server(node, port: int) -> Iterator[None]:
    proc = spawn_cli(
        node, "stress", "--passive", "--backend", node.backend, "-s", node.addr4, "-p", str(port)
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"passive on {node.addr4}:{port}" in line, line + (proc.stderr.read() if proc.stderr else "")
        yield
    finally:
        stop_process(proc, 15)


@pytest.mark.slow
def test_cli_ping_info_stress_across_nodes(rds_two_nodes, rds_observe):
    nodes = rds_two_nodes
    na, nb = nodes.a, nodes.b
    # both nodes have RDS sockets open (a userspace node's stack runs while it has users, as a kernel node's
    # rds_tcp is loaded): without a stack in B's namespace nothing would answer A's pings
    nodes.bound_pair()
    # ping both ways: every reply line names the peer, the summary counts them, exit status 0
    for src, dst in ((na, nb), (nb, na)):
        proc = run_cli(
            src, "ping", "--backend", src.backend, "-c", "3", "-i", "0.2", "-I", src.addr4, dst.addr4
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        replies = [ln for ln in proc.stdout.splitlines() if "usec" in ln and f"from {dst.addr4}" in ln]
        assert len(replies) == 3, proc.stdout
        assert "3 pings sent, 3 replies received, 0% loss" in proc.stdout, proc.stdout
    # info: the RDS/TCP connection the pings used is listed on both nodes, as a table and as JSON
    for me, peer in ((na, nb), (nb, na)):
        proc = run_cli(me, "info", "--backend", me.backend, "-n", "--json")
        assert proc.returncode == 0, proc.stderr
        conns = json.loads(proc.stdout)["connections"]
        ours = [c for c in conns if str(c.get("faddr")) == peer.addr4]
        assert ours, conns
        assert any(c.get("transport") == "tcp" for c in ours), ours
        table = run_cli(me, "info", "--backend", me.backend, "-n")
        assert table.returncode == 0 and peer.addr4 in table.stdout, table.stdout + table.stderr
    # stress: A's active side against B's passive server, request/response, for 2 s
    port = 4300 + os.getpid() % 500
    with passive_server(nb, port):
        stress = ["stress", "--backend", na.backend, "-s", na.addr4, "-r", nb.addr4, "-p", str(port)]
        proc = run_cli(na, *stress, "-T", "2", "-q", "1K", "--rr", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == na.backend and doc["mode"] == "rr"
    assert doc["messages"] > 0 and doc["msgs_per_s"] > 0 and doc["errors"] == []
    assert doc["rtt_us"]["p50"] > 0
    rds_observe("stress_ok", True)
