"""Bounded resources of the userspace stack service (issue 8; docs/userspace.md, "Bounded resources").

A raw RDS/TCP peer in a second namespace floods the service (whose namespace has the larger address, so it
only accepts): messages to a bound socket that never reads, and pings whose pongs it never reads. The service
must stop reading that TCP connection (the flooder's sends stall) with its resident memory under a bound,
resume when the socket is read (every message delivered, in order) and give the memory back when it closes.
And a service out of descriptors answers socket() with an errno instead of leaving it waiting forever.
Root only (network namespaces, a foreground service under a low RLIMIT_NOFILE).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from pyrds.userspace.config import stack_address
from pyrds.userspace.proto.header import RDSHeader
from tests.unit.userspace.fakes import veth_namespaces

pytestmark = pytest.mark.netns

SRC, DST = "10.66.0.1", "10.66.0.9"
PORT = 5000
MSG = 1024
#: a receive queue is capped at 8 MiB of payload + 256 bytes per message (stack/resources.py): the flood
#: below would queue 200 MiB without the cap; with it the service stays far under this growth
RSS_GROWTH_LIMIT_KB = 64 * 1024
#: after the socket closes the service is back within this of where it started
RSS_RETURN_LIMIT_KB = 24 * 1024


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def service_pid(sock: Any) -> int:
    cred = sock._ctl.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[:4], sys.byteorder)


def frame(seq: int, dport: int, payload: bytes, sport: int = 4000) -> bytes:
    return RDSHeader(seq, 0, len(payload), sport, dport, 0, 0, 0, ()).encode() + payload


@contextlib.contextmanager
def stack_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("PYRDS_STACK_NAME", "PYRDS_TCP_PORT", "PYRDS_IDLE_EXIT")}
    os.environ.update(
        PYRDS_STACK_NAME=f"pyrds-bounded-{uuid.uuid4().hex[:12]}", PYRDS_TCP_PORT="16385", PYRDS_IDLE_EXIT="2"
    )
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def wire() -> Iterator[tuple[str, str]]:
    with stack_env(), veth_namespaces("bnd", [f"{SRC}/24"], [f"{DST}/24"]) as pair:
        yield pair


def _bound_socket(ns: str) -> Any:
    from pyrds import netns

    def make() -> Any:
        import pyrds

        s = pyrds.socket("userspace")
        s.bind((DST, PORT))
        return s

    return netns.run_in_netns(ns, make)


def _peer(ns: str) -> socket.socket:
    from pyrds import netns

    def dial() -> socket.socket:
        return socket.create_connection((DST, 16385), timeout=10, source_address=(SRC, 0))

    return netns.run_in_netns(ns, dial)


class Flooder(threading.Thread):
    """Writes ``frames`` to ``sock`` until done or a write stalls for ``stall`` seconds (the service stopped
    reading and TCP flow control pushed back)."""

    def __init__(self, sock: socket.socket, chunks: Iterator[bytes], stall: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.sock, self.chunks, self.stall = sock, chunks, stall
        self.sent = 0
        self.stalled = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for chunk in self.chunks:
                view = memoryview(chunk)
                while view:
                    self.sock.settimeout(self.stall)
                    try:
                        n = self.sock.send(view)
                    except TimeoutError:
                        self.stalled.set()
                        self.sock.settimeout(60)
                        n = self.sock.send(view)
                    view = view[n:]
                    self.sent += n
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.done.set()


def _message_chunks(count: int, per_chunk: int = 64) -> Iterator[bytes]:
    for start in range(1, count + 1, per_chunk):
        stop = min(count + 1, start + per_chunk)
        yield b"".join(frame(seq, PORT, b"%08d" % seq + b"m" * (MSG - 8)) for seq in range(start, stop))


def test_flood_of_unread_socket_stalls_peer_bounded_rss_and_memory_returns(wire: tuple[str, str]) -> None:
    """200,000 x 1 KiB messages to a bound socket that never reads: the service stops reading the peer's
    connection (the flood stalls with most of it unsent), its RSS grows by less than RSS_GROWTH_LIMIT_KB,
    and after the socket closes the service reads on (dropping: no socket) and its RSS is back within
    RSS_RETURN_LIMIT_KB of the start. Without the cap the service queued all 200 MiB."""
    a, b = wire
    count = 200_000
    sink = _bound_socket(b)
    pid = service_pid(sink)
    time.sleep(0.5)
    base = rss_kb(pid)
    peer = _peer(a)
    flood = Flooder(peer, _message_chunks(count))
    try:
        flood.start()
        assert flood.stalled.wait(60) or flood.done.is_set()
        at_stall = flood.sent
        peak = rss_kb(pid)
        for _ in range(10):  # stays stalled and bounded
            time.sleep(0.2)
            peak = max(peak, rss_kb(pid))
        assert flood.error is None, flood.error
        assert not flood.done.is_set(), "the whole flood was accepted: nothing pushed back"
        assert flood.sent < count * (MSG + 48) // 4
        assert peak - base < RSS_GROWTH_LIMIT_KB, (base, peak)
        sink.close()  # the held connection is read again; the rest is dropped (no socket)
        assert flood.done.wait(60), "the connection was not resumed after the socket closed"
        assert flood.error is None, flood.error
        deadline = time.monotonic() + 20
        after = rss_kb(pid)
        while after - base >= RSS_RETURN_LIMIT_KB and time.monotonic() < deadline:
            time.sleep(0.25)
            after = rss_kb(pid)
        print(f"VmRSS kB: start {base}, held {peak}, after close {after}; stalled after {at_stall} bytes")
        assert after - base < RSS_RETURN_LIMIT_KB, (base, peak, after)
    finally:
        peer.close()
        flood.join(5)


def test_held_connection_resumes_when_the_socket_drains(wire: tuple[str, str]) -> None:
    """30,000 x 1 KiB (about 3.6 times the cap): the flood stalls while nobody reads, then every message is
    delivered in order once the socket reads (the connection is resumed, no deadlock, nothing lost)."""
    a, b = wire
    count = 30_000
    sink = _bound_socket(b)
    peer = _peer(a)
    flood = Flooder(peer, _message_chunks(count))
    try:
        flood.start()
        assert flood.stalled.wait(60) or flood.done.is_set()
        # seen once in each of two sessions under -n 2 load, unexplained: say how the flood ended
        assert not flood.done.is_set(), f"flood ended: sent {flood.sent} bytes, error {flood.error!r}"
        sink.settimeout(30)
        for seq in range(1, count + 1):
            data = sink.recv(2 * MSG)
            assert int(data[:8]) == seq
        assert flood.done.wait(30)
        assert flood.error is None, flood.error
        from pyrds.userspace.control import stack_counters

        counters = stack_counters(sink)
        assert counters["recv_cap_hold"] >= 1
    finally:
        sink.close()
        peer.close()
        flood.join(5)


def test_ping_flood_without_reading_pongs_is_bounded(wire: tuple[str, str]) -> None:
    """400,000 pings from a peer that never reads the pongs: the service answers up to PONG_MAX (8192) unacked
    pongs per path and drops the rest (counted), so its RSS stays bounded (it grew by ~100 MB before)."""
    a, b = wire
    count = 400_000
    sink = _bound_socket(b)  # starts the service (and keeps it up)
    pid = service_pid(sink)
    time.sleep(0.5)
    base = rss_kb(pid)
    peer = _peer(a)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    def pings() -> Iterator[bytes]:
        for start in range(1, count + 1, 1024):
            yield b"".join(frame(seq, 0, b"") for seq in range(start, min(count + 1, start + 1024)))

    flood = Flooder(peer, pings(), stall=30)
    try:
        flood.start()
        assert flood.done.wait(60), "the ping flood did not finish"
        assert flood.error is None, flood.error
        from pyrds.userspace.control import stack_counters

        deadline = time.monotonic() + 30
        while stack_counters(sink)["recv_ping"] < count and time.monotonic() < deadline:
            time.sleep(0.2)
        counters = stack_counters(sink)
        assert counters["recv_ping"] == count
        grown = rss_kb(pid) - base
        dropped = counters.get("pong_dropped")
        print(f"VmRSS kB: start {base}, after the ping flood +{grown}; pongs dropped {dropped}")
        assert grown < 32 * 1024, (base, grown)
        assert dropped is not None and dropped > 0
        sink.close()
        peer.close()  # unread pongs: a reset
        deadline = time.monotonic() + 30  # PYRDS_IDLE_EXIT=2: the service idles out once the peer is gone
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(f"/proc/{pid}"), "the service did not idle out after the ping flood"
    finally:
        sink.close()
        peer.close()
        flood.join(5)


# -- EMFILE in the service


def _limit_fds(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_service_out_of_descriptors_answers_socket_with_an_errno() -> None:
    """A service limited to 64 descriptors: socket() after socket() until one fails; it must fail promptly
    with EMFILE (or ENFILE/ENOBUFS/ENOMEM), never block, the service must not spin, and once sockets are
    closed socket() works again. Before, the 20th socket() waited forever while the service spun."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the shared stack name)")
    import pyrds

    with stack_env():
        os.environ["PYRDS_IDLE_EXIT"] = "30"
        env = dict(os.environ, PYRDS_TCP_PORT=str(21000 + os.getpid() % 20000))
        svc = subprocess.Popen(
            [sys.executable, "-m", "pyrds.userspace.service", "--shared"],
            env=env,
            preexec_fn=lambda: _limit_fds(64),  # noqa: PLW1509 - single-threaded child setup
            stdin=subprocess.DEVNULL,
        )
        socks: list[Any] = []
        try:
            deadline = time.monotonic() + 30
            while True:  # wait for our service's listener (a client would start another one)
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    probe.connect(stack_address())
                    break
                except OSError:
                    assert time.monotonic() < deadline, "service did not start"
                    time.sleep(0.1)
                finally:
                    probe.close()
            result: list[Any] = []

            def open_until_error() -> None:
                try:
                    for _ in range(200):
                        socks.append(pyrds.socket("userspace"))
                    result.append(None)
                except OSError as exc:
                    result.append(exc)

            t = threading.Thread(target=open_until_error, daemon=True)
            t.start()
            t.join(30)
            assert not t.is_alive(), f"socket() blocked with {len(socks)} sockets open in a 64-fd service"
            exc = result[0]
            print(f"socket() #{len(socks) + 1} of a 64-fd service: {exc!r}")
            assert isinstance(exc, OSError), "200 sockets in a service limited to 64 descriptors"
            assert exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM), exc
            assert svc.poll() is None
            # a refused socket() leaves no spinning service behind: under a tenth of a CPU-second per second
            cpu = _cpu_seconds(svc.pid)
            time.sleep(1.0)
            assert _cpu_seconds(svc.pid) - cpu < 0.1
            for s in socks[-4:]:
                s.close()
            del socks[-4:]
            time.sleep(0.2)
            s = pyrds.socket("userspace")  # descriptors free again: served
            s.bind(("127.0.0.1", 0))
            s.close()
        finally:
            for s in socks:
                s.close()
            svc.terminate()
            svc.wait(10)


@pytest.mark.parametrize("client_sends_first", [True, False])
def test_client_reads_the_refusal_of_a_service_that_closed(client_sends_first: bool) -> None:
    """The service's refusal at EMFILE is one record and a close. The client sees its errno whether its
    request was sent before the close (ECONNRESET on recv, then the record is read) or after it (EPIPE on
    send, then the record is read)."""
    from pyrds.userspace import rpc
    from pyrds.userspace.client.socket import RDSSocket, _refusal

    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock = object.__new__(RDSSocket)
    sock._lock = threading.Lock()
    sock._ctl = client
    sock._limit = rpc.CHUNK
    try:

        def refuse() -> None:
            server.send(bytes([rpc.LAST]) + rpc.encode((errno.EMFILE, None)))
            server.close()

        if client_sends_first:
            # the service closes with the request unread: the client's recv fails with ECONNRESET first
            # (what _call catches), the refusal record is still there to read
            rpc.send_record(client, rpc.encode((int(rpc.Op.OPEN), ())))
            refuse()
            with pytest.raises(ConnectionResetError):
                rpc.recv_record(client)
            assert _refusal(client) == errno.EMFILE
            return
        refuse()
        with pytest.raises(OSError) as err:
            sock._call(rpc.Op.OPEN, (), want_fds=1)
        assert err.value.errno == errno.EMFILE
    finally:
        client.close()
        server.close()
