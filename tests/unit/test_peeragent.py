"""pyrds.testing.wirecodec and pyrds.testing.peeragent: the bounded encoding, and an agent that serves a
network peer without trusting it (token, allowlists, errors per request)."""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pyrds import info
from pyrds.constants import InfoType
from pyrds.testing import peeragent, wirecodec
from pyrds.testing.agent import AgentError

TOKEN = "0123456789abcdef0123"


# -- the codec -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        255,
        -(1 << 127),
        (1 << 128) - 1,
        1.5,
        "",
        "héllo",
        b"",
        b"\x00" * 70_000,
        [1, [2, (3, b"x")]],
        (),
        {"a": 1, 7: "b", ("10.0.0.1", 4000): {"n": None}},
        ipaddress.IPv4Address("10.98.0.1"),
        ipaddress.IPv6Address("fd00:98::1"),
    ],
)
def test_codec_round_trips(value: Any) -> None:
    assert wirecodec.decode(wirecodec.encode(value)) == value
    assert type(wirecodec.decode(wirecodec.encode(value))) is type(value)


def test_codec_carries_info_records_in_the_kernels_layout() -> None:
    rec = info.RdmaConnection6Info(
        ipaddress.IPv6Address("fd00:98::1"),
        ipaddress.IPv6Address("fd00:98::2"),
        b"\x01" * 16,
        b"\x02" * 16,
        256,
        1024,
        8,
        4096,
        257,
        0,
        0,
        12,
    )
    assert wirecodec.decode(wirecodec.encode([rec])) == [rec]
    assert wirecodec.encode(InfoType.RDS_INFO_COUNTERS) == wirecodec.encode(int(InfoType.RDS_INFO_COUNTERS))


@pytest.mark.parametrize("value", [object(), {1, 2}, 1j, [object()]])
def test_codec_refuses_other_kinds(value: Any) -> None:
    with pytest.raises(TypeError):
        wirecodec.encode(value)


def test_codec_bounds_on_encode() -> None:
    with pytest.raises(ValueError):
        wirecodec.encode(1 << 128)
    with pytest.raises(ValueError):
        wirecodec.encode(b"x" * (wirecodec.MAX_BYTES + 1))
    with pytest.raises(ValueError):
        wirecodec.encode(list(range(wirecodec.MAX_ITEMS + 1)))
    deep: Any = 0
    for _ in range(wirecodec.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(ValueError):
        wirecodec.encode(deep)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"?",
        b"N extra",
        b"i\x00",
        b"i\x12" + b"\x00" * 18,
        b"s" + struct.pack(">I", 5) + b"ab",
        b"s" + struct.pack(">I", 2) + b"\xff\xfe",
        b"b" + struct.pack(">I", wirecodec.MAX_BYTES + 1),
        b"l" + struct.pack(">I", wirecodec.MAX_ITEMS + 1),
        b"l" + struct.pack(">I", 3) + b"N",
        b"d" + struct.pack(">I", 1) + b"l" + struct.pack(">I", 0) + b"N",
        b"a\x05" + b"\x00" * 5,
        b"R" + struct.pack(">I", 9999) + b"\x00" * 64,
        b"R" + struct.pack(">I", int(InfoType.RDS_INFO_IB_CONNECTIONS)) + b"\x00" * 3,
        b"l" + struct.pack(">I", 1) * (wirecodec.MAX_DEPTH + 2),
    ],
)
def test_codec_refuses_hostile_bytes(raw: bytes) -> None:
    with pytest.raises(ValueError):
        wirecodec.decode(raw)


# -- the server's checks -------------------------------------------------------------------------------------
class FakeSock:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []
        self.closed = False

    def sendto(self, data: bytes, addr: Any) -> int:
        self.sent.append((data, addr))
        return len(data)

    def getsockname(self) -> tuple[str, int]:
        return ("10.98.0.2", 4000)

    def recv(self, n: int, flags: int = 0) -> bytes:
        raise OSError(11, "Resource temporarily unavailable")

    def close(self) -> None:
        self.closed = True

    def fileno(self) -> int:
        return -1

    def setsockopt(self, *args: Any) -> None:
        raise AssertionError("not called")


@pytest.fixture
def fake_sockets(monkeypatch: pytest.MonkeyPatch) -> list[FakeSock]:
    import pyrds

    made: list[FakeSock] = []

    def make(backend: str) -> FakeSock:
        s = FakeSock()
        made.append(s)
        return s

    monkeypatch.setattr(pyrds, "socket", make)
    return made


def test_server_runs_allowed_calls_and_refuses_the_rest(fake_sockets: list[FakeSock]) -> None:
    srv = peeragent.PeerServer()
    ok, handle = srv.handle(("socket", "kernel"))
    assert ok == "ok" and isinstance(handle, int)
    assert srv.handle(("call", handle, "sendto", (b"hi", ("10.98.0.1", 5000)))) == ("ok", 2)
    assert fake_sockets[0].sent == [(b"hi", ("10.98.0.1", 5000))]
    assert srv.handle(("call", handle, "getsockname", ())) == ("ok", ("10.98.0.2", 4000))
    assert srv.handle(("call", handle, "recv", (10,))) == ("oserror", 11, "Resource temporarily unavailable")
    refused = [
        ("call", handle, "__class__", ()),
        ("call", handle, "fileno", ()),
        ("call", handle, "sendto", "not a sequence"),
        ("call", "1", "getsockname", ()),
        ("call", 999, "getsockname", ()),
        ("socket", "ctypes"),
        ("write_file", "/etc/passwd", "x"),
        ("read_file", "/etc/shadow"),
        ("job", "os:system", [handle], {"command": "true"}),
        ("job", "pyrds.testing.workloads:exchange", [handle], {1: 2}),
        ("wait", 1, -5),
        ("poll", handle, 1, 10**9),
        ("mem_alloc", 1 << 40),
        "not a tuple",
        (),
        (7,),
    ]
    for req in refused:
        reply = srv.handle(req)
        assert reply[0] == "error", (req, reply)
        assert reply[1] in ("TypeError", "ValueError", "KeyError"), (req, reply)
    assert srv.handle(("getpid",))[0] == "ok"  # still serving after every refusal
    srv.handle(("close_all",))
    assert fake_sockets[0].closed


# -- over TCP ------------------------------------------------------------------------------------------------
def _closed_without_reply(c: socket.socket) -> bool:
    c.settimeout(10)
    try:
        return c.recv(100) == b""
    except ConnectionResetError:  # closed with our unread frame in its queue: a reset
        return True


def _serve_one(lsock: socket.socket, results: list[bool]) -> None:
    conn, _ = lsock.accept()
    results.append(peeragent.serve_connection(conn, TOKEN))


@pytest.fixture
def listener() -> Any:
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    yield lsock
    lsock.close()


def test_peer_agent_end_to_end(listener: socket.socket, fake_sockets: list[FakeSock]) -> None:
    results: list[bool] = []
    t = threading.Thread(target=_serve_one, args=(listener, results))
    t.start()
    agent = peeragent.PeerAgent("127.0.0.1", listener.getsockname()[1], TOKEN, name="B")
    s = agent.socket("kernel")
    assert s.sendto(b"payload", ("10.98.0.1", 5000)) == 7
    assert s.getsockname() == ("10.98.0.2", 4000)
    with pytest.raises(OSError) as ei:
        s.recv(10)
    assert ei.value.errno == 11
    with pytest.raises(ValueError):
        agent.request("call", s.handle, "fileno", ())
    with pytest.raises(ValueError):
        agent.request("write_file", "/tmp/x", "y")
    assert agent.broken is None and agent.proc.poll() is None
    agent.close()
    t.join(10)
    assert results == [True] and fake_sockets[0].closed
    with pytest.raises(AgentError):
        agent.request("getpid")


@pytest.mark.parametrize(
    "first",
    [
        ("hello", "wrong-token-wrong-token"),
        ("hello", TOKEN[:-1]),
        ("getpid",),
        "hello",
    ],
)
def test_wrong_hello_closes_the_connection(listener: socket.socket, first: Any) -> None:
    results: list[bool] = []
    t = threading.Thread(target=_serve_one, args=(listener, results))
    t.start()
    c = socket.create_connection(listener.getsockname())
    peeragent.send_frame(c, first)
    peeragent.send_frame(c, ("getpid",))
    assert _closed_without_reply(c)
    c.close()
    t.join(10)
    assert results == [False]


def test_oversize_or_garbage_frame_closes_the_connection(listener: socket.socket) -> None:
    for raw in (struct.pack(">I", wirecodec.MAX_FRAME + 1), struct.pack(">I", 3) + b"xyz"):
        results: list[bool] = []
        t = threading.Thread(target=_serve_one, args=(listener, results))
        t.start()
        c = socket.create_connection(listener.getsockname())
        c.sendall(raw)
        assert _closed_without_reply(c)
        c.close()
        t.join(10)
        assert results == [False]


def test_serve_refuses_a_short_token() -> None:
    with pytest.raises(ValueError):
        peeragent.serve("127.0.0.1", 0, "127.0.0.1", "short")


def test_every_job_an_ib_scenario_starts_is_allowed() -> None:
    """kernel->userspace runs the IB scenarios' jobs on the peer guest: a job missing from JOBS would turn
    that pairing into an error there (test_ib_selftest's socket_selftest once was)."""
    root = Path(__file__).resolve().parents[2]
    named = set()
    for path in [*root.joinpath("tests", "conformance").glob("test_ib*.py"), root / "pyrds/testing/ib.py"]:
        named |= set(re.findall(r'agent\.job\(\s*"([\w.]+:\w+)"', path.read_text()))
    assert "pyrds.testing.workloads:socket_selftest" in named
    assert named <= peeragent.JOBS, named - peeragent.JOBS


def test_a_long_wait_is_several_requests_the_server_takes() -> None:
    """test_ib_selftest at 50,000 messages waits 30,030 s for its job: the client asks in slices (the server
    refuses a wait over WAIT_MAX, and one request's reply must come within its wait + REPLY_TIMEOUT)."""
    agent = peeragent.PeerAgent.__new__(peeragent.PeerAgent)
    asked: list[float] = []

    def request(op: str, jid: int, left: float, *, timeout: float) -> Any:
        assert (op, jid, left) == ("wait", 7, timeout)
        asked.append(left)
        if len(asked) < 3:
            raise TimeoutError("job 7 still running")
        return {"done": True}

    agent.request = request  # type: ignore[method-assign]
    assert agent.wait(7, 30030.0) == {"done": True}
    assert asked == [peeragent.WAIT_SLICE] * 3 and peeragent.WAIT_SLICE <= peeragent.WAIT_MAX
    asked.clear()
    assert agent.wait(7, None) == {"done": True}
    assert asked == [peeragent.WAIT_SLICE] * 3
    srv = peeragent.PeerServer()
    assert srv.handle(("wait", 1, peeragent.WAIT_MAX + 1))[0] == "error"


def test_a_wait_past_its_deadline_raises_timeout() -> None:
    agent = peeragent.PeerAgent.__new__(peeragent.PeerAgent)
    asked: list[float] = []

    def request(op: str, jid: int, left: float, *, timeout: float) -> Any:
        asked.append(left)
        time.sleep(min(left, 0.05))
        raise TimeoutError("job 7 still running")

    agent.request = request  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        agent.wait(7, 0.12)
    assert 2 <= len(asked) <= 4 and all(0 <= a <= 0.12 for a in asked)
