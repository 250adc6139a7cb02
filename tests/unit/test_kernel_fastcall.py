"""The optional C data calls of the kernel backend (pyrds/kernel/_fastcall.c, issue 10 part 1): which argument
shapes skip the Python closure, that every other shape reaches it unchanged, and that on real sockets a data
call then runs no Python frame at all.

The C module is built by setup.py when a compiler and Python's headers are there. Without it these tests skip
with the reason, except under CI or PYRDS_REQUIRE_FASTCALL=1, where a missing module fails them.
"""

from __future__ import annotations

import gc
import socket
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from fastcall_check import fastcall_module, python_calls_during

from pyrds.kernel import socket as ksock
from pyrds.kernel.socket import RDSSocket


@pytest.fixture
def fc() -> ModuleType:
    return fastcall_module()


VIEW = object()


def method(view: Any, *args: Any) -> tuple[Any, ...]:
    return ("C", view, args)


def fallback(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return ("py", args, kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "fast"),
    [
        ((10,), {}, True),
        ((10, 0), {}, True),
        ((10, socket.MSG_PEEK | socket.MSG_DONTWAIT), {}, True),
        ((10, socket.MSG_TRUNC), {}, False),
        ((10, socket.MSG_TRUNC | socket.MSG_PEEK), {}, False),
        ((10, -1), {}, False),  # a negative int has the MSG_TRUNC bit (Python's & agrees)
        ((10, True), {}, True),  # an int subclass: its value decides, as in the closure (operator.index)
        ((10, socket.MSG_TRUNC | socket.MSG_DONTWAIT), {}, False),  # a socket.MsgFlag
        ((10, 1 << 70), {}, False),
        ((10, 0.0), {}, False),
        ((), {}, False),
        ((10, 0, 1), {}, False),
        ((10,), {"flags": 0}, False),
    ],
)
def test_recv_shapes(fc: ModuleType, args: tuple[Any, ...], kwargs: dict[str, Any], fast: bool) -> None:
    call = fc.FastCall(fc.RECV, "recv", fallback, method, VIEW)
    expected = ("C", VIEW, args) if fast else ("py", args, kwargs)
    assert call(*args, **kwargs) == expected


@pytest.mark.parametrize(
    ("args", "fast"),
    [
        (("buf",), True),
        (("buf", 4), True),
        (("buf", 4, 0), True),
        (("buf", 0, socket.MSG_WAITALL), True),
        (("buf", 4, socket.MSG_TRUNC), False),
        (("buf", 4, 0, 9), False),
        ((), False),
    ],
)
def test_recv_into_shapes(fc: ModuleType, args: tuple[Any, ...], fast: bool) -> None:
    call = fc.FastCall(fc.RECV_INTO, "recv_into", fallback, method, VIEW)
    assert call(*args) == (("C", VIEW, args) if fast else ("py", args, {}))


def test_sendto_uses_the_route_of_the_same_address_object(fc: ModuleType) -> None:
    addr = ("127.0.0.1", 4000)
    view4, view6 = object(), object()
    state: list[Any] = [(addr, None, None, ("127.0.0.1", 4000), view4, False)]  # a name's route, say
    call = fc.FastCall(fc.SENDTO, "sendto", fallback, method, None, state)
    assert call(b"x", addr) == ("C", view4, (b"x", ("127.0.0.1", 4000)))
    assert call(b"x", 5, addr) == ("C", view4, (b"x", 5, ("127.0.0.1", 4000)))
    equal = ("127.0.0.1", 4000 + 0 * len(addr))  # equal, not the same object
    assert equal is not addr and call(b"x", equal) == ("py", (b"x", equal), {})
    assert call(b"x") == ("py", (b"x",), {})
    assert call(b"x", 0, addr, 1) == ("py", (b"x", 0, addr, 1), {})
    assert call(b"x", address=addr) == ("py", (b"x",), {"address": addr})
    # the closure learns a new destination by replacing the list's item: the C call reads it
    addr6 = ("::1", 5, 0, 0)
    state[0] = (addr6, None, None, ("::1", 5, 0, 0), view6, False)
    assert call(b"y", addr6) == ("C", view6, (b"y", ("::1", 5, 0, 0)))
    assert call(b"y", addr) == ("py", (b"y", addr), {})
    state[0] = "not a route"  # never trusted: the closure gets the call
    assert call(b"z", addr6) == ("py", (b"z", addr6), {})


class Str(str):
    pass


class Int(int):
    pass


def test_an_equal_address_is_the_same_destination_when_its_host_is_a_literal(fc: ModuleType) -> None:
    """A server replies to each source recvfrom returned: a new tuple per message, equal to the last one."""
    host = "".join(["10.0.0.", "1"])  # not the interned literal below
    addr = ("10.0.0.1", 4000)
    view = object()
    state: list[Any] = [(addr, None, None, ("10.0.0.1", 4000), view, True)]
    call = fc.FastCall(fc.SENDTO, "sendto", fallback, method, None, state)
    new = (host, 4000)
    assert new is not addr and new[0] is not addr[0]
    assert call(b"x", new) == ("C", view, (b"x", ("10.0.0.1", 4000)))
    assert call(b"x", 0, (host, 4000 + len(host) * 0)) == ("C", view, (b"x", 0, ("10.0.0.1", 4000)))
    for other in [
        (host, 4001),
        ("10.0.0.2", 4000),
        (Str(host), 4000),  # a subclass could define its own equality: the closure decides
        (host, Int(4000)),
        (host, 4000, 0, 0),
        ("10.0.0.\u0661", 4000),  # same length, another kind of str
        ("10.0.0.10", 4000),
        (host, 4000 + 2**64),  # beyond a C long: never the route's port
        (host, -4000),
        [host, 4000],
        (host,),
    ]:
        assert call(b"x", other) == ("py", (b"x", other), {}), other
    addr6 = ("fd00::1", 9, 0, 0)
    state[0] = (addr6, None, None, addr6, view, True)
    assert call(b"y", ("fd00::1", 9, 0, 0 + len(host) * 0)) == ("C", view, (b"y", addr6))
    assert call(b"y", ("fd00::1", 9, 1, 0)) == ("py", (b"y", ("fd00::1", 9, 1, 0)), {})
    sendmsg = fc.FastCall(fc.SENDMSG, "sendmsg", fallback, method, object(), state)
    assert sendmsg([b"z"], [], 0, ("fd00::1", 9, 0, 0)) == ("C", view, ([b"z"], [], 0, addr6))


def test_sendmsg_shapes(fc: ModuleType) -> None:
    addr = ("127.0.0.1", 4000)
    view4, view6 = object(), object()
    state: list[Any] = [(addr, None, None, ("127.0.0.1", 4000), view4, False)]
    call = fc.FastCall(fc.SENDMSG, "sendmsg", fallback, method, view6, state)
    bufs = [b"a"]
    assert call(bufs) == ("C", view6, (bufs,))
    assert call(bufs, []) == ("C", view6, (bufs, []))
    assert call(bufs, (), 0) == ("C", view6, (bufs, (), 0))
    assert call(bufs, (), 0, None) == ("C", view6, (bufs, (), 0))
    assert call(bufs, (), 0, addr) == ("C", view4, (bufs, (), 0, ("127.0.0.1", 4000)))
    cmsgs = [(1, 2, b"")]
    assert call(bufs, cmsgs, 0, addr) == ("py", (bufs, cmsgs, 0, addr), {})  # the closure checks ancdata
    assert call(bufs, ((),)) == ("py", (bufs, ((),)), {})
    assert call(bufs, "", 0, addr) == ("py", (bufs, "", 0, addr), {})  # falsy but not an empty list/tuple
    assert call(bufs, (), 0, ("127.0.0.1", 4000 + 0 * len(bufs))) == (
        "py",
        (bufs, (), 0, ("127.0.0.1", 4000)),
        {},
    )
    assert call() == ("py", (), {})
    assert call(bufs, address=addr) == ("py", (bufs,), {"address": addr})


def test_errors_of_the_called_method_pass_through(fc: ModuleType) -> None:
    def refuse(view: Any, *args: Any) -> None:
        raise BlockingIOError(11, "EAGAIN")

    call = fc.FastCall(fc.RECV, "recv", fallback, refuse, VIEW)
    with pytest.raises(BlockingIOError):
        call(1)


def test_bad_construction(fc: ModuleType) -> None:
    with pytest.raises(ValueError):
        fc.FastCall(99, "x", fallback, method, VIEW)
    with pytest.raises(TypeError):
        fc.FastCall(fc.RECV, "x", None, method, VIEW)
    with pytest.raises(TypeError):
        fc.FastCall(fc.RECV, "x", fallback, None, VIEW)
    with pytest.raises(TypeError):
        fc.FastCall(fc.RECV, "x", fallback, method)  # no view
    with pytest.raises(TypeError):
        fc.FastCall(fc.SENDTO, "x", fallback, method, None, [])  # state must hold one item
    with pytest.raises(TypeError):
        fc.FastCall(fc.SENDTO, "x", fallback, method, None, None)
    call = fc.FastCall(fc.RECV, "recv", fallback, method, VIEW)
    assert call.__name__ == "recv" and call.fallback is fallback and "recv" in repr(call)


def test_a_cycle_through_a_fastcall_is_collected(fc: ModuleType) -> None:
    class Fallback:
        call: Any = None

        def __call__(self, *args: Any) -> None:
            return None

    f = Fallback()
    f.call = fc.FastCall(fc.RECV, "recv", f, method, VIEW)  # f -> call -> f
    gone = weakref.ref(f)
    del f
    gc.collect()
    assert gone() is None


# -- on real sockets (UDP fds on loopback: the same C methods as AF_RDS, see test_kernel_fastpath.py)


@pytest.fixture
def pair(fc: ModuleType) -> Iterator[tuple[RDSSocket, RDSSocket]]:
    socks = []
    for _ in range(2):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        socks.append(RDSSocket(fileno=s.detach()))
    socks[1].settimeout(5)
    yield socks[0], socks[1]
    for s in socks:
        s.close()


def test_data_calls_run_no_python_frame(pair: tuple[RDSSocket, RDSSocket]) -> None:
    a, b = pair
    dest, src = b.getsockname(), a.getsockname()
    a.sendto(b"warm", dest)  # learns the route (a Python call, once per destination)
    assert b.recvfrom(10) == (b"warm", src)
    buf = bytearray(16)
    results: list[Any] = []

    def traffic() -> None:
        results.append(a.sendto(b"one", dest))
        results.append(a.sendto(b"two", 0, dest))
        results.append(a.sendmsg([b"th", b"ree"], [], 0, dest))
        results.append(a.sendmsg([b"four"], (), 0, dest))
        results.append(b.recvfrom(10))
        results.append(b.recv(10, socket.MSG_DONTWAIT))
        results.append(b.recvmsg(10))
        results.append(b.recv_into(buf))
        a.sendto(b"five", dest)
        results.append(b.recvfrom_into(buf, 8))

    assert python_calls_during(traffic) == []
    assert results == [3, 3, 5, 4, (b"one", src), b"two", (b"three", [], 0, src), 4, (4, src)]
    # a server's pattern: reply to the address recvfrom returned (a new, equal tuple every time)
    echoed: list[Any] = []

    def echo() -> None:
        for i in range(3):
            a.sendto(b"ping%d" % i, dest)
            data, source = b.recvfrom(10)
            b.sendto(data, source)
            echoed.append(a.recvfrom(10))

    b.sendto(b"learn", src)  # b's first destination: learned once by the closure
    assert a.recvfrom(10) == (b"learn", dest)
    assert python_calls_during(echo) == []
    assert echoed == [(b"ping%d" % i, dest) for i in range(3)]
    # MSG_TRUNC and a new destination take the closure: still correct, one Python call each
    a.sendto(b"0123456789", dest)
    calls = python_calls_during(lambda: results.append(b.recv(4, socket.MSG_TRUNC)))
    assert calls == ["_data_calls.<locals>.recv"]
    assert results[-1] == b"0123"


def test_pure_python_mode_when_the_module_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """FASTCALL = None (as on a machine without a compiler): closures, same results."""
    monkeypatch.setattr(ksock, "FASTCALL", None)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    r = RDSSocket(fileno=s.detach())
    try:
        assert type(r.recv).__name__ == "function"
        r.sendto(b"self", r.getsockname())
        r.settimeout(5)
        assert r.recvfrom(10) == (b"self", r.getsockname())
    finally:
        r.close()


def test_a_c_method_runs_only_on_its_own_type(fc: ModuleType) -> None:
    """The stdlib's METH_VARARGS methods are called through their C function: only after the type check the
    method descriptor itself makes (a view of another type gets the descriptor's TypeError)."""
    import _socket

    call = fc.FastCall(fc.RECV, "recv", fallback, _socket.socket.recv, object())
    with pytest.raises(TypeError, match="doesn't apply"):
        call(10)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        s.sendto(b"own", s.getsockname())
        state: list[Any] = [(s.getsockname(), None, None, s.getsockname(), s, True)]
        send = fc.FastCall(fc.SENDTO, "sendto", fallback, _socket.socket.sendto, None, state)
        recv = fc.FastCall(fc.RECV, "recvfrom", fallback, _socket.socket.recvfrom, s)
        assert send(b"again", state[0][0]) == 5
        assert recv(10) == (b"own", s.getsockname())
        assert recv(10, 0) == (b"again", s.getsockname())
        with pytest.raises(BlockingIOError):
            recv(10)
        state[0] = (state[0][0], None, None, state[0][3], object(), True)  # a view of the wrong type
        with pytest.raises(TypeError, match="doesn't apply"):
            send(b"x", state[0][0])
    finally:
        s.close()
