"""A scripted 7.x kernel dialer (RDS/TCP by hand, the smaller address) against a userspace stack in another
network namespace (root): its probe carries NPATHS, GEN_NUM and SPORT_IDX, it then dials paths 1..7 in
parallel from ``ALIGN(low, 8) + group * 8 + i`` ports (not pyrds tags) in random order, re-dials path 3
before the stack saw the old connection close, and retransmits an old path-3 message with its path-3
sequence number: the stack must pair every connection with its path (the duplicate is dropped, not
delivered), deliver each path's messages once and in order, and answer with NPATHS=8 and SPORT_IDX."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.unit.userspace.fakes import veth_namespaces

pytestmark = pytest.mark.netns

_KERNEL = """
import fcntl, random, socket, struct, sys, termios, time
from pyrds.constants import HeaderFlag
from pyrds.userspace.proto import PathEngine, RDSHeader

# 7.x rds_send_probe's extensions, as raw wire bytes: NPATHS 8, GEN_NUM 0x7a7a, SPORT_IDX
PROBE_EXT = bytes([5, 0, 8, 6, 0, 0, 0x7A, 0x7A, 8, 0]).ljust(16, b"\\0")

DST = ("10.77.0.9", int(sys.argv[1]))
N = {i: 30 for i in range(8)}
N[3] = 120


def kport(i):
    while True:
        p = 32768 + random.randrange(3000) * 8 + i
        if p & 0xF8 != 0xA8:  # not a pyrds tag
            return p


def dial(i):
    while True:
        s = socket.socket()
        try:
            s.bind(("10.77.0.1", kport(i)))
        except OSError:
            s.close()
            continue
        s.connect(DST)
        s.setblocking(False)
        return s


def outq(s):
    return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.TIOCOUTQ, b"\\0" * 4))[0]


rx = b""


def pong_ext():  # the extension area of the stack's probe pong on path 0 (raw framing)
    global rx
    try:
        rx += socks[0].recv(1 << 20)
    except BlockingIOError:
        pass
    while len(rx) >= 48:
        length = struct.unpack_from(">I", rx, 16)[0]
        if len(rx) < 48 + length:
            break
        sport, dport = struct.unpack_from(">HH", rx, 20)
        hdr, rx = rx[:48], rx[48 + length :]
        if (sport, dport) == (0, 1):
            return hdr[32:48]
    return None


eng = {i: PathEngine("10.77.0.1", "10.77.0.9", i, ping_enable=False) for i in range(8)}
socks = {}
socks[0] = dial(0)
eng[0].connection_made(0.0)
eng[0].queue(1, 0, b"")  # the probe (its extensions are patched in below)
for n in range(N[0]):
    eng[0].queue(7000, 5000, b"0:%d" % n)
data = bytearray(eng[0].bytes_to_send())
probe_at = 48 + 8192  # after the congestion map
assert struct.unpack_from(">HH", data, probe_at + 20) == (1, 0)
data[probe_at + 32 : probe_at + 48] = PROBE_EXT
socks[0].setblocking(True)
socks[0].sendall(data)
socks[0].setblocking(False)
deadline = time.monotonic() + 10
ext = None
while ext is None and time.monotonic() < deadline:
    ext = pong_ext()
    time.sleep(0.01)
assert ext is not None and ext[:5] == bytes([5, 0, 8, 8, 0]), ext  # the pong: NPATHS 8, then SPORT_IDX
for i in random.sample(range(1, 8), 7):  # rds_start_mprds: every other path at once
    socks[i] = dial(i)
    eng[i].connection_made(0.0)
    for n in range(N[i]):
        eng[i].queue(7000 + i, 5000, b"%d:%d" % (i, n))
    socks[i].setblocking(True)
    socks[i].sendall(eng[i].bytes_to_send())
    socks[i].setblocking(False)
for i in socks:
    while outq(socks[i]):
        time.sleep(0.01)
    eng[i].acked_through(eng[i].tx_bytes)
time.sleep(0.3)
old = socks[3]
socks[3] = dial(3)  # path 3 again, before the stack has seen the old one close
old.close()
eng[3].connection_lost(1.0)
eng[3].connection_made(1.0)
dup = RDSHeader(sequence=100, length=5, sport=7003, dport=5000, flags=HeaderFlag.RETRANSMITTED)
socks[3].setblocking(True)
socks[3].sendall(dup.encode() + b"3:dup")  # seq 100 of path 3: already delivered there
for n in range(N[3], N[3] + 20):
    eng[3].queue(7003, 5000, b"3:%d" % n)
socks[3].sendall(eng[3].bytes_to_send())
print("sent", flush=True)
sys.stdin.readline()
"""

_RECV = """
import sys, pyrds
from pyrds.userspace.control import stack_counters
s = pyrds.socket("userspace")
s.bind(("10.77.0.9", 5000))
s.settimeout(20)
print("ready", flush=True)
want = {i: 30 for i in range(8)}
want[3] = 140
got = {i: [] for i in range(8)}
while sum(len(v) for v in got.values()) < sum(want.values()):
    d, a = s.recvfrom(100)
    lane, n = d.split(b":")
    assert n != b"dup", "the retransmission reached another path: delivered as new"
    got[int(lane)].append(int(n))
s.settimeout(0.5)
try:
    raise SystemExit(f"unexpected extra message {s.recv(100)!r}")
except TimeoutError:
    pass
assert got == {i: list(range(want[i])) for i in range(8)}, got
print("ok", stack_counters(s)["recv_drop_old_seq"], flush=True)
"""


@pytest.fixture
def netns_pair() -> Iterator[tuple[str, str]]:
    with veth_namespaces("rds7", ["10.77.0.1/24"], ["10.77.0.9/24"]) as pair:
        yield pair


def test_7x_kernel_dialer_paths_pair_by_source_port(netns_pair: tuple[str, str]) -> None:
    from pyrds.netns import popen_in_netns

    a, b = netns_pair
    port = os.environ["PYRDS_TCP_PORT"]
    env = dict(os.environ, PYRDS_IDLE_EXIT="2")
    recv = popen_in_netns(b, [sys.executable, "-c", _RECV], env=env, stdout=subprocess.PIPE, text=True)
    kernel = None
    try:
        assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
        kernel = popen_in_netns(
            a,
            [sys.executable, "-c", _KERNEL, port],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert kernel.stdout is not None and kernel.stdin is not None
        line = kernel.stdout.readline().strip()
        if line != "sent":
            kernel.kill()
            raise AssertionError(kernel.communicate()[1])
        out, _ = recv.communicate(timeout=40)
        kernel.stdin.write("done\n")
        kernel.stdin.flush()
        kernel.wait(timeout=10)
    finally:
        recv.kill()
        if kernel is not None:
            kernel.kill()
    status, dropped = out.split()
    assert status == "ok" and int(dropped) >= 1
