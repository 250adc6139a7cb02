"""Host-side checks of pyrds.kernel (no AF_RDS needed): cmsg packing, argument validation."""

from __future__ import annotations

import socket

import pytest

from pyrds.kernel import libc
from pyrds.kernel.socket import RDSSocket


@pytest.mark.parametrize("n", [0, 1, 4, 8, 16, 36, 56, 72])
def test_cmsg_macros_match_stdlib(n: int) -> None:
    assert libc.cmsg_len(n) == socket.CMSG_LEN(n)
    assert libc.cmsg_space(n) == socket.CMSG_SPACE(n)


def test_pack_unpack_roundtrip() -> None:
    items = [(276, 5, b"12345678"), (1, 29, b"x" * 16), (276, 12, b"abcd")]
    buf = libc.pack_cmsgs(items)
    assert len(buf) == sum(socket.CMSG_SPACE(len(d)) for _, _, d in items)
    assert libc.unpack_cmsgs(buf) == items


def test_pack_matches_kernel_via_unix_socket() -> None:
    # the kernel parses our control buffer: SCM_RIGHTS through a unix socketpair
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        r, w = socket.socketpair()
        with r, w:
            msg = libc.msghdr()
            import ctypes

            data = ctypes.create_string_buffer(b"hi")
            iov = libc.iovec(ctypes.addressof(data), 2)
            msg.msg_iov = ctypes.pointer(iov)
            msg.msg_iovlen = 1
            ctl = ctypes.create_string_buffer(
                libc.pack_cmsgs([(socket.SOL_SOCKET, socket.SCM_RIGHTS, r.fileno().to_bytes(4, "little"))])
            )
            msg.msg_control = ctypes.addressof(ctl)
            msg.msg_controllen = len(ctl.raw) - 1
            assert libc.sendmsg(a.fileno(), msg, 0) == 2
            got, anc, _flags, _addr = b.recvmsg(10, socket.CMSG_SPACE(4))
            assert got == b"hi"
            assert anc[0][:2] == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
            socket.close(int.from_bytes(anc[0][2], "little"))


def _fake() -> RDSSocket:
    # an RDSSocket around a UDP fd: argument checks must fire before any system call
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    return RDSSocket(fileno=s.detach())


def test_argument_errors_before_syscalls() -> None:
    with _fake() as s:
        with pytest.raises(TypeError):
            s.bind("10.0.0.1")  # type: ignore[arg-type]
        with pytest.raises(OverflowError):
            s.bind(("10.0.0.1", 70000))
        with pytest.raises(TypeError):
            s.sendmsg([b"x"], flags="0")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            s.sendmsg(["str"])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            s.sendmsg([b"x"], [(1, 2)])  # type: ignore[list-item]
        with pytest.raises(ValueError):
            s.recvmsg(-1)
        with pytest.raises(ValueError):
            s.set_tos(256)
        with pytest.raises(TypeError):
            s.set_tos("1")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            s.settimeout(-1)
        with pytest.raises(ValueError):
            s.getsockopt(276, 10000, -5)
        s.settimeout(0.05)
        assert s.gettimeout() == 0.05
        with pytest.raises(TimeoutError):
            s.recvmsg(10)
        s.settimeout(0)
        with pytest.raises(BlockingIOError):
            s.recvmsg(10)


def test_closed_socket_is_ebadf() -> None:
    s = _fake()
    s.close()
    s.close()
    assert s.fileno() == -1
    with pytest.raises(OSError) as ei:
        s.getsockname()
    assert ei.value.errno == 9
