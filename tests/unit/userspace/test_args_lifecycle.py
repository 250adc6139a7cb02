"""Issue 8, items 6 and 7 on the userspace backend, with real sockets and real service processes.

Arguments: bad data/flags/buffer sizes fail as CPython's socket fails them (the kernel backend runs CPython's
own C methods, so that is the kernel backend's behaviour too), before any request reaches the service; an
oversize send is EMSGSIZE and leaves the socket usable; option values are checked like the kernel backend;
an IPv4-bound socket is refused an IPv6 peer at connect() and send() (EOPNOTSUPP, rds_sendmsg's errno for an
address-family mismatch: the kernel itself only checks it for an explicit destination). A transport that
raises after the reply costs the sender nothing (no send-buffer leak).

Lifecycle: the service exits once its last client closed even while an RDS/TCP dial to an unreachable peer
is pending, and it is never left a zombie in the process that started it.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyrds.constants import RDS_MAX_MSG_SIZE, SOL_RDS, SockOpt
from pyrds.constants import Transport as TransportType
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.service import Service
from pyrds.userspace.stack.sockstate import Outgoing
from tests.unit.userspace.fakes import NullTransport, veth_namespaces

A4 = "127.0.0.1"
WAIT_LIMIT = 60.0  # generous: a poll that normally ends within a second or two


def _poll(cond: Any, limit: float = WAIT_LIMIT) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


@pytest.fixture
def pair() -> Iterator[tuple[RDSSocket, RDSSocket]]:
    a, b = RDSSocket(), RDSSocket()
    a.bind((A4, 0))
    b.bind((A4, 0))
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _outcome(fn: Any, args: tuple[Any, ...]) -> tuple[str, str]:
    try:
        return "returned", repr(fn(*args))
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return type(exc).__name__, str(exc)


ADDR = object()  # stands for the destination: the peer's RDS address, or a UDP address for the stdlib
BAD_DATA_CALLS = [
    ("send", (123,)),
    ("send", ("abc",)),
    ("send", ([1, 2, 3],)),
    ("send", (b"x", "1")),
    ("send", (b"x", 1 << 31)),
    ("send", (b"x", -(1 << 31) - 1)),
    ("sendto", (123, ADDR)),
    ("sendto", ([1, 2, 3], ADDR)),
    ("sendto", (b"x", "f", ADDR)),
    ("sendto", (b"x", 1 << 40, ADDR)),
    ("sendmsg", (b"abc",)),
    ("sendmsg", (123,)),
    ("sendmsg", ([123],)),
    ("sendmsg", (["text"],)),
    ("sendmsg", ([b"x"], 5)),
    ("sendmsg", ([b"x"], [], "f")),
    ("sendmsg", ([b"x"], [], 1 << 40)),
    ("sendmsg", ([memoryview(b"abcd")[::2]],)),
    ("recv", ("10",)),
    ("recv", (-1,)),
    ("recv", (1.5,)),
    ("recv", (1 << 70,)),
    ("recv", (10, "f")),
    ("recvfrom", (-1,)),
    ("recvfrom", ("10",)),
    ("recvmsg", (10, -1)),
    ("recvmsg", ("10",)),
    ("recvmsg", (10, "1")),
    ("recvmsg", (10, 0, 1 << 40)),
]


@pytest.mark.parametrize(
    ("method", "args"), BAD_DATA_CALLS, ids=[f"{m}{i}" for i, (m, _a) in enumerate(BAD_DATA_CALLS)]
)
def test_bad_data_arguments_fail_like_the_stdlib_before_any_request(
    pair: tuple[RDSSocket, RDSSocket], method: str, args: tuple[Any, ...]
) -> None:
    """Same exception type and message as a stdlib socket (CPython's C methods, which the kernel backend
    calls), and nothing reaches the peer: ``send(123)`` used to send 123 zero bytes, ``sendmsg(b"abc")``
    294, ``recv('10')`` failed with a TypeError about ``<``."""
    a, b = pair
    std = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    std.setblocking(False)
    try:
        expected = _outcome(getattr(std, method), tuple(("127.0.0.1", 9) if x is ADDR else x for x in args))
    finally:
        std.close()
    got = _outcome(getattr(a, method), tuple(b.getsockname() if x is ADDR else x for x in args))
    assert expected[0] != "returned"
    assert got == expected
    a.connect(b.getsockname())  # a connected socket too: send() has a destination, still nothing is sent
    assert _outcome(getattr(a, method), tuple(b.getsockname() if x is ADDR else x for x in args)) == expected
    with pytest.raises(BlockingIOError):
        b.recv(10)


@pytest.mark.parametrize("dest", [(), ("127.0.0.1",), ("127.0.0.1", 1, 2)], ids=["empty", "host", "three"])
def test_a_destination_of_the_wrong_length_is_a_type_error(
    pair: tuple[RDSSocket, RDSSocket], dest: tuple[Any, ...]
) -> None:
    """As the stdlib's (a TypeError, before any request): ``sendto(b"x", ())`` raised IndexError from the
    destination cache's type check until 2026-12-03."""
    a, b = pair
    for call in (lambda: a.sendto(b"x", dest), lambda: a.sendmsg([b"x"], [], 0, dest)):
        with pytest.raises(TypeError, match="RDS address must be"):
            call()
    with pytest.raises(BlockingIOError):
        b.recv(10)


def test_oversize_send_is_emsgsize_in_the_kernels_order_and_keeps_the_socket(
    pair: tuple[RDSSocket, RDSSocket],
) -> None:
    """Over RDS_MAX_MSG_SIZE: EMSGSIZE, also for sizes a control record cannot hold (a 5 MiB send used to
    drop the control connection: EPIPE, socket gone); an earlier check of rds_sendmsg still wins (unbound:
    ENOTCONN); the socket keeps working."""
    a, b = pair
    dest = b.getsockname()
    for size in (RDS_MAX_MSG_SIZE + 1, 5 << 20):
        with pytest.raises(OSError) as ei:
            a.sendto(b"\0" * size, dest)
        assert ei.value.errno == errno.EMSGSIZE
        with pytest.raises(OSError) as ei:
            a.sendmsg([b"\0" * (size // 2), bytearray(size - size // 2)], [], 0, dest)
        assert ei.value.errno == errno.EMSGSIZE
    with RDSSocket() as unbound:
        with pytest.raises(OSError) as ei:
            unbound.sendto(b"\0" * (5 << 20), dest)
        assert ei.value.errno == errno.ENOTCONN
    with pytest.raises(OSError) as ei:
        a.sendto(b"\0" * (5 << 20), socket.MSG_MORE, dest)  # an unsupported flag: checked before the size
    assert ei.value.errno == errno.EOPNOTSUPP
    assert a.sendto(b"still here", dest) == 10
    assert _poll(lambda: _readable(b))
    assert b.recv(100) == b"still here"


def _readable(s: RDSSocket) -> bool:
    import select

    return bool(select.select([s.fileno()], [], [], 0)[0])


def test_option_values_checked_like_the_kernel_backend(pair: tuple[RDSSocket, RDSSocket]) -> None:
    """setsockopt int values outside a C int's range are OverflowError (SO_SNDBUF of 2**64 and 10**30 used
    to be accepted and wrapped); 2**31..2**32-1 are a C int's bit pattern, as on the kernel backend; a huge
    bytes value is read like the kernel reads an optval (its first bytes) instead of killing the socket;
    level/optname/buflen/tos are checked like the kernel backend."""
    a, b = pair
    sol, sndbuf = socket.SOL_SOCKET, socket.SO_SNDBUF
    for bad in (1 << 64, 10**30, 1 << 32, -(1 << 31) - 1):
        with pytest.raises(OverflowError):
            a.setsockopt(sol, sndbuf, bad)
    a.setsockopt(sol, sndbuf, -(1 << 31))
    as_negative = a.getsockopt(sol, sndbuf)
    a.setsockopt(sol, sndbuf, 4096)
    a.setsockopt(sol, sndbuf, 1 << 31)  # the same four bytes as -(2**31)
    assert a.getsockopt(sol, sndbuf) == as_negative
    a.setsockopt(sol, socket.SO_RCVBUF, struct.pack("=i", 65536) + bytes(5 << 20))
    assert a.getsockopt(sol, socket.SO_RCVBUF) == 2 * 65536
    with pytest.raises(TypeError, match="level must be int, not str"):
        a.setsockopt("1", sndbuf, 1)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        a.setsockopt(1 << 40, sndbuf, 1)
    with pytest.raises(TypeError, match="value must be a bytes-like object, not str"):
        a.setsockopt(sol, sndbuf, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="buflen must be >= 0"):
        a.getsockopt(sol, sndbuf, -1)
    with pytest.raises(TypeError):
        a.getsockopt(sol, sndbuf, "4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tos must be 0-255"):
        a.set_tos(256)
    with pytest.raises(TypeError):
        a.settimeout("1")  # type: ignore[arg-type]
    dest = b.getsockname()
    assert a.sendto(b"alive", dest) == 5
    assert _poll(lambda: _readable(b))
    assert b.recv(10) == b"alive"


def test_family_mismatch_like_the_kernel(pair: tuple[RDSSocket, RDSSocket]) -> None:
    """What 7.3 did in a guest (2026-11-24): an IPv4-bound socket may connect() to an IPv6 peer and its send()
    reaches the socket bound there, with the IPv4 source (likewise IPv6 -> IPv4); sendto() naming the other
    family is EOPNOTSUPP ("IPv4/IPv6 address mismatch"). A connected remote peer of the other family, which
    the kernel would dial at the IPv6 address's low 32 bits, is refused with that errno at send() (a
    documented divergence), and never reaches the TCP transport. v4-mapped IPv6 addresses are IPv4."""
    a, b = pair
    b6 = RDSSocket()
    b6.bind(("::1", 0))
    v6_peer = b6.getsockname()
    with pytest.raises(OSError) as ei:
        a.sendto(b"x", v6_peer)
    assert ei.value.errno == errno.EOPNOTSUPP
    a.connect(v6_peer)
    assert a.send(b"to-v6") == 5
    assert _poll(lambda: _readable(b6))
    assert b6.recvfrom(10) == (b"to-v6", a.getsockname())
    b6.connect(b.getsockname())
    assert b6.send(b"to-v4") == 5
    assert _poll(lambda: _readable(b))
    data, src = b.recvfrom(10)
    assert data == b"to-v4" and src[:2] == v6_peer[:2]
    remote = RDSSocket()
    remote.bind((A4, 0))
    remote.connect(("2001:db8::1", 4000, 0, 0))  # not local: refused before any transport sees it
    for _ in range(200):  # never accounted: no EAGAIN once the send buffer would have filled
        with pytest.raises(OSError) as ei:
            remote.send(b"x" * 1000)
        assert ei.value.errno == errno.EOPNOTSUPP
    a.connect(("::ffff:127.0.0.1", b.getsockname()[1], 0, 0))  # v4-mapped: an IPv4 peer
    assert a.send(b"mapped") == 6
    assert _poll(lambda: _readable(b))
    assert b.recv(10) == b"mapped"
    remote.close()
    b6.close()


class _RaisingTransport(NullTransport):
    """A network transport whose transmit raises, as TcpTransport.transmit did for an IPv4 source and an
    IPv6 destination (a ValueError inside the service, after the send's reply)."""

    kind = TransportType.TCP

    def __init__(self) -> None:
        self.calls = 0

    def transmit(self, msg: Outgoing, hash_key: Any) -> None:
        self.calls += 1
        raise ValueError("transport bug")


def test_a_transport_raising_after_the_reply_leaks_nothing() -> None:
    """The probe's symptom: ~107 sends 'succeeded', then EAGAIN forever (the bytes were accounted and never
    released). Now a message a transport refuses is dropped and its bytes released: every send goes on
    succeeding and the service keeps serving."""
    svc = Service()
    svc.bind()
    bad = _RaisingTransport()
    svc.stack.attach(bad)  # type: ignore[arg-type]
    th = threading.Thread(target=svc.serve_forever, daemon=True)
    th.start()
    try:
        s = RDSSocket()
        # SO_RDS_TRANSPORT TCP: bound to 127.0.0.1 it would have the loop transport, which carries all its
        # messages (rds_conn_create keeps rs_transport for a remote destination)
        s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TransportType.TCP))
        s.bind((A4, 0))
        s.setblocking(False)
        for _ in range(1000):
            assert s.sendto(b"x" * 1024, ("192.0.2.1", 4000)) == 1024  # not local: the network transport
        assert _poll(lambda: bad.calls == 1000)  # each after its send's reply
        assert s.getsockname()[0] == A4
        s.close()
    finally:
        svc.stop()
        th.join(10)


# -- lifecycle: real service processes
_UNREACHABLE_CLIENT = """
import sys, time, pyrds
from pyrds.constants import InfoConnectionFlag, InfoType
s = pyrds.socket("userspace")
s.bind(("10.99.0.1", 0))
s.sendto(b"nobody answers", ("10.99.0.2", 4000))
deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # wait until the stack dials (a TCP SYN into the dummy device)
    if any(c.flags & InfoConnectionFlag.CONNECTING for c in s.get_info(InfoType.RDS_INFO_CONNECTIONS)):
        break
    time.sleep(0.05)
else:
    sys.exit("no dial")
s.close()
print("closed", flush=True)
"""


def test_service_exits_while_a_dial_to_an_unreachable_peer_is_pending() -> None:
    """A socket sent to an address nobody answers (a permanent neighbour entry with a MAC nobody has: the
    SYNs leave and are never answered, the dial stays in SYN_SENT for minutes) and closed: the service used
    to stay (the dial made its transport busy); now it exits PYRDS_IDLE_EXIT (1 s here) after the last
    client closed."""
    netns = pytest.importorskip("pyrds.netns")
    with veth_namespaces("rdsidle", ["10.99.0.1/24"], ["10.99.0.9/24"]) as (ns, _peer):
        neigh = ["ip", "neigh", "replace", "10.99.0.2", "lladdr", "02:00:00:00:00:99", "dev", "va"]
        assert netns.popen_in_netns(ns, neigh).wait(30) == 0
        client = netns.popen_in_netns(
            ns, [sys.executable, "-c", _UNREACHABLE_CLIENT], stdout=subprocess.PIPE, text=True
        )
        out, _ = client.communicate(timeout=WAIT_LIMIT + 30)
        assert client.returncode == 0 and "closed" in out
        assert _poll(lambda: not netns.netns_pids(ns)), "the service is still running"


_STARTER = """
import os, sys, time, pyrds
from pyrds.userspace.config import peer_cred
s = pyrds.socket("userspace")
pid = peer_cred(s._ctl).pid
s.close()

def state(p):
    try:
        with open(f"/proc/{p}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0], int(rest[1])
    except (FileNotFoundError, ProcessLookupError):
        return None, None

deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # the service exits about 1 s after its last client (PYRDS_IDLE_EXIT)
    st, ppid = state(pid)
    if st in (None, "Z"):
        break
    time.sleep(0.05)
else:
    sys.exit("service did not exit")
mine = []
for d in os.listdir("/proc"):
    if d.isdigit():
        st, ppid = state(d)
        if ppid == os.getpid() and st == "Z":
            mine.append(int(d))
print("service", pid, "zombie children", mine, "service parent", state(pid)[1], flush=True)
sys.exit(1 if mine or state(pid)[1] == os.getpid() else 0)
"""


def test_autostarted_service_is_never_a_zombie_of_its_starter() -> None:
    """The process whose socket started the service outlives it: no defunct child is left in it (the service
    used to be its direct child, never waited for)."""
    env = dict(os.environ, PYRDS_IDLE_EXIT="1")
    proc = subprocess.run(
        [sys.executable, "-c", _STARTER], env=env, capture_output=True, text=True, timeout=WAIT_LIMIT + 30
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
