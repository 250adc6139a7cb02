"""RDS/TCP between two stacks in two network namespaces over veth (root): ordered exactly-once delivery
across a forced reconnect, and a garbage peer dropped and counted while the real connection keeps working."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pyrds.netns import popen_in_netns
from tests.unit.userspace.fakes import veth_namespaces

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
from pyrds.userspace.control import stack_counters
c = stack_counters(s)
print("ok", c["tcp_protocol_error"], len(s.get_info(InfoType.RDS_INFO_TCP_SOCKETS)), flush=True)
"""

_SEND = """
import socket, subprocess, sys, time, pyrds
from pyrds.userspace.proto.pathset import dial_port
n = int(sys.argv[1]); port = int(sys.argv[2]); kill = sys.argv[3] == "1"
s = pyrds.socket("userspace"); s.bind(("10.77.0.1", 0))
for i in range(n):
    s.sendto(b"%08d" % i + b"x" * 1016, ("10.77.0.9", 5000))
    if i == n // 2:
        time.sleep(0.2)
        if kill:
            out = subprocess.run(["ss", "-K", "dst", "10.77.0.9"], check=True, capture_output=True, text=True)
            assert "10.77.0.9:" in out.stdout, out.stdout
        # a source port that looks like a pyrds dialer's path 5 (6.1 random ports do, 1 in 32): before
        # any handshake it must be read like any other dialer's connection, then dropped and counted
        g = socket.create_connection(("10.77.0.9", port), source_address=("10.77.0.5", dial_port(11, 5)))
        g.sendall(b"\\xff" * 4096)
s.settimeout(10)
s.sendto(b"", ("10.77.0.9", 0))  # RDS ping: the peer's stack answers with an empty pong from port 0
assert s.recvfrom(10) == (b"", ("10.77.0.9", 0))
from pyrds.constants import InfoType
from pyrds.userspace.control import stack_counters
c = stack_counters(s)
print("sent", c["conn_reset"], flush=True)
"""


@pytest.fixture
def netns_pair() -> Iterator[tuple[str, str]]:
    with veth_namespaces("rds", ["10.77.0.1/24", "10.77.0.5/24"], ["10.77.0.9/24"]) as pair:
        yield pair


@pytest.mark.parametrize(
    "kill",
    [False, True],
)
def test_tcp_exactly_once_and_garbage_peer(netns_pair: tuple[str, str], kill: bool) -> None:
    a, b = netns_pair
    n = 4000
    env = dict(os.environ, PYRDS_IDLE_EXIT="2", PYRDS_TCP_PORT="16385", PYRDS_TCP_PEER_PORT="16385")
    recv = popen_in_netns(
        b,
        [sys.executable, "-c", _RECV, str(n)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout is not None
        assert recv.stdout.readline().strip() == "ready"
        send = popen_in_netns(
            a,
            [sys.executable, "-c", _SEND, str(n), "16385", "1" if kill else "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        send_out, send_err = send.communicate(timeout=40)
        assert send.returncode == 0, send_err
        out, _ = recv.communicate(timeout=60)
    finally:
        recv.kill()
    status, resets = send_out.split()
    assert status == "sent" and (int(resets) >= 1) == kill
    assert recv.returncode == 0
    status, errors, tcp_sockets = out.split()
    assert status == "ok" and int(errors) >= 1
    assert int(tcp_sockets) >= 2  # the npaths handshake brought up more than path 0


_QRECV = """
import sys, pyrds
n = int(sys.argv[1]); s = pyrds.socket("userspace"); s.bind(("10.77.0.9", 5001)); s.settimeout(30)
print("ready", flush=True)
got = [int(s.recv(2048)[:8]) for _ in range(n)]  # a canceled b"canceled" message would fail int()
assert got == list(range(n)), got
s.settimeout(1)
try:
    extra = s.recv(2048)
    raise SystemExit(f"unexpected message {extra[:8]!r}")
except TimeoutError:
    pass
print("ok", flush=True)
"""

_QSEND = """
import errno, select, socket, struct, sys, pyrds
from pyrds.constants import SOL_RDS, SockOpt
dest = ("10.77.0.9", 5001)
s = pyrds.socket("userspace"); s.bind(("10.77.0.1", 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)  # rds sndbuf = 8192 bytes
s.setblocking(False)

def fill(tag):
    n = 0
    try:
        while True:
            s.sendto((b"%08d" % n if tag is None else tag) + b"q" * 1016, dest)
            n += 1
    except OSError as e:
        assert e.errno == errno.EAGAIN, e
    assert select.select([], [s], [], 0)[1] == [], "POLLOUT while the send queue is full"
    return n

fill(b"canceled")
sin = struct.pack("=H", socket.AF_INET) + struct.pack("!H", dest[1]) + socket.inet_aton(dest[0]) + bytes(8)
s.setsockopt(SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sin)
assert select.select([], [s], [], 0)[1] == [s], "no POLLOUT after RDS_CANCEL_SENT_TO"
print("full", fill(None), flush=True)
sys.stdin.readline()
assert select.select([], [s], [], 30)[1] == [s], "no POLLOUT after the peer came up"
print("writable", flush=True)
"""


def test_tcp_queue_while_down_pollout_and_delivery(netns_pair: tuple[str, str]) -> None:
    a, b = netns_pair
    env = dict(os.environ, PYRDS_IDLE_EXIT="2", PYRDS_TCP_PORT="16385", PYRDS_TCP_PEER_PORT="16385")
    subprocess.run(["ip", "-n", b, "link", "set", "vb", "down"], check=True)
    send = popen_in_netns(
        a, [sys.executable, "-c", _QSEND], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    recv = None
    try:
        assert send.stdout is not None and send.stdin is not None
        status, count = send.stdout.readline().split()
        assert status == "full" and int(count) == 8  # accepted while queued bytes < sndbuf/2
        recv = popen_in_netns(
            b, [sys.executable, "-c", _QRECV, count], env=env, stdout=subprocess.PIPE, text=True
        )
        assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "-n", b, "link", "set", "vb", "up"], check=True)
        send.stdin.write("go\n")
        send.stdin.flush()
        assert send.stdout.readline().strip() == "writable"
        out, _ = recv.communicate(timeout=40)
        assert out.strip() == "ok"
    finally:
        send.kill()
        if recv is not None:
            recv.kill()
