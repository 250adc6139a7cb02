"""RDS/TCP between two stacks in two network namespaces over veth (root): ordered exactly-once delivery
across a forced reconnect, and a garbage peer dropped and counted while the real connection keeps working."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.netns

_RECV = """
import sys, pyrds
from pyrds.constants import InfoType
n = int(sys.argv[1]); s = pyrds.socket("userspace"); s.bind(("10.77.0.9", 5000)); s.settimeout(30)
print("ready", flush=True)
for i in range(n):
    d, a = s.recvfrom(4096)
    assert int(d[:8]) == i, (i, d[:8])
    assert a[0] == "10.77.0.1"
c = {r.name: r.value for r in s.get_info(InfoType.RDS_INFO_COUNTERS)}
print("ok", c["tcp_protocol_error"], len(s.get_info(InfoType.RDS_INFO_TCP_SOCKETS)), flush=True)
"""

_SEND = """
import socket, subprocess, sys, time, pyrds
n = int(sys.argv[1]); port = int(sys.argv[2]); kill = sys.argv[3] == "1"
s = pyrds.socket("userspace"); s.bind(("10.77.0.1", 0))
for i in range(n):
    s.sendto(b"%08d" % i + b"x" * 1016, ("10.77.0.9", 5000))
    if i == n // 2:
        time.sleep(0.2)
        if kill:
            out = subprocess.run(["ss", "-K", "dst", "10.77.0.9"], check=True, capture_output=True, text=True)
            assert "10.77.0.9:" in out.stdout, out.stdout
        g = socket.create_connection(("10.77.0.9", port), source_address=("10.77.0.5", 0))
        g.sendall(b"\\xff" * 4096)
from pyrds.constants import InfoType
c = {r.name: r.value for r in s.get_info(InfoType.RDS_INFO_COUNTERS)}
print("sent", c["conn_reset"], flush=True)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def netns_pair() -> tuple[str, str]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2")
    tag = uuid.uuid4().hex[:6]
    a, b = f"rdsA{tag}", f"rdsB{tag}"
    _ip("netns", "add", a)
    _ip("netns", "add", b)
    try:
        _ip("link", "add", f"va{tag}", "netns", a, "type", "veth", "peer", "name", f"vb{tag}", "netns", b)
        _ip("-n", a, "addr", "add", "10.77.0.1/24", "dev", f"va{tag}")
        _ip("-n", a, "addr", "add", "10.77.0.5/24", "dev", f"va{tag}")
        _ip("-n", b, "addr", "add", "10.77.0.9/24", "dev", f"vb{tag}")
        for ns, dev in ((a, f"va{tag}"), (b, f"vb{tag}")):
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in (a, b):  # the stack services this test started in its namespaces
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except ProcessLookupError:
                    pass
        _ip("netns", "del", a)
        _ip("netns", "del", b)


@pytest.mark.parametrize(
    "kill",
    [False, True],
)
def test_tcp_exactly_once_and_garbage_peer(netns_pair: tuple[str, str], kill: bool) -> None:
    a, b = netns_pair
    n = 4000
    env = dict(os.environ, PYRDS_IDLE_EXIT="2", PYRDS_TCP_PORT="16385", PYRDS_TCP_PEER_PORT="16385")
    recv = subprocess.Popen(
        ["ip", "netns", "exec", b, sys.executable, "-c", _RECV, str(n)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout is not None
        assert recv.stdout.readline().strip() == "ready"
        send = subprocess.run(
            ["ip", "netns", "exec", a, sys.executable, "-c", _SEND, str(n), "16385", "1" if kill else "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=40,
        )
        assert send.returncode == 0, send.stderr
        out, _ = recv.communicate(timeout=60)
    finally:
        recv.kill()
    status, resets = send.stdout.split()
    assert status == "sent" and (int(resets) >= 1) == kill
    assert recv.returncode == 0
    status, errors, tcp_sockets = out.split()
    assert status == "ok" and int(errors) >= 1
    assert int(tcp_sockets) >= 2  # the npaths handshake brought up more than path 0
