"""Layout of pyrds.uapi: pinned numbers, then proven against the real linux/rds.h with gcc."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pyrds import uapi

HEADER = Path("/usr/include/linux/rds.h")

# struct -> (sizeof, {field: offset}) as pinned from linux/rds.h on x86_64.
PINNED: dict[str, tuple[int, dict[str, int]]] = {
    "rds_info_counter": (40, {"name": 0, "value": 32}),
    "rds_info_connection": (
        42,
        {
            "next_tx_seq": 0,
            "next_rx_seq": 8,
            "laddr": 16,
            "faddr": 20,
            "transport": 24,
            "flags": 40,
            "tos": 41,
        },
    ),
    "rds6_info_connection": (
        65,
        {"next_tx_seq": 0, "next_rx_seq": 8, "laddr": 16, "faddr": 32, "transport": 48, "flags": 64},
    ),
    "rds_info_message": (
        26,
        {"seq": 0, "len": 8, "laddr": 12, "faddr": 16, "lport": 20, "fport": 22, "flags": 24, "tos": 25},
    ),
    "rds6_info_message": (
        50,
        {"seq": 0, "len": 8, "laddr": 12, "faddr": 28, "lport": 44, "fport": 46, "flags": 48, "tos": 49},
    ),
    "rds_info_socket": (
        28,
        {
            "sndbuf": 0,
            "bound_addr": 4,
            "connected_addr": 8,
            "bound_port": 12,
            "connected_port": 14,
            "rcvbuf": 16,
            "inum": 20,
        },
    ),
    "rds6_info_socket": (
        52,
        {
            "sndbuf": 0,
            "bound_addr": 4,
            "connected_addr": 20,
            "bound_port": 36,
            "connected_port": 38,
            "rcvbuf": 40,
            "inum": 44,
        },
    ),
    "rds_info_tcp_socket": (
        41,
        {
            "local_addr": 0,
            "local_port": 4,
            "peer_addr": 6,
            "peer_port": 10,
            "hdr_rem": 12,
            "data_rem": 20,
            "last_sent_nxt": 28,
            "last_expected_una": 32,
            "last_seen_una": 36,
            "tos": 40,
        },
    ),
    "rds6_info_tcp_socket": (
        64,
        {
            "local_addr": 0,
            "local_port": 16,
            "peer_addr": 18,
            "peer_port": 34,
            "hdr_rem": 36,
            "data_rem": 44,
            "last_sent_nxt": 52,
            "last_expected_una": 56,
            "last_seen_una": 60,
        },
    ),
    "rds_info_rdma_connection": (
        68,
        {
            "src_addr": 0,
            "dst_addr": 4,
            "src_gid": 8,
            "dst_gid": 24,
            "max_send_wr": 40,
            "max_recv_wr": 44,
            "max_send_sge": 48,
            "rdma_mr_max": 52,
            "rdma_mr_size": 56,
            "tos": 60,
            "sl": 61,
            "cache_allocs": 64,
        },
    ),
    "rds6_info_rdma_connection": (
        92,
        {
            "src_addr": 0,
            "dst_addr": 16,
            "src_gid": 32,
            "dst_gid": 48,
            "max_send_wr": 64,
            "max_recv_wr": 68,
            "max_send_sge": 72,
            "rdma_mr_max": 76,
            "rdma_mr_size": 80,
            "tos": 84,
            "sl": 85,
            "cache_allocs": 88,
        },
    ),
    "rds_rx_trace_so": (4, {"rx_traces": 0, "rx_trace_pos": 1}),
    "rds_cmsg_rx_trace": (32, {"rx_traces": 0, "rx_trace_pos": 1, "rx_trace": 8}),
    "rds_iovec": (16, {"addr": 0, "bytes": 8}),
    "rds_get_mr_args": (32, {"vec": 0, "cookie_addr": 16, "flags": 24}),
    "rds_get_mr_for_dest_args": (160, {"dest_addr": 0, "vec": 128, "cookie_addr": 144, "flags": 152}),
    "rds_free_mr_args": (16, {"cookie": 0, "flags": 8}),
    "rds_rdma_args": (
        56,
        {"cookie": 0, "remote_vec": 8, "local_vec_addr": 24, "nr_local": 32, "flags": 40, "user_token": 48},
    ),
    "rds_atomic_args": (
        72,
        {
            "cookie": 0,
            "local_addr": 8,
            "remote_addr": 16,
            "cswp": 24,
            "fadd": 24,
            "m_cswp": 24,
            "m_fadd": 24,
            "flags": 56,
            "user_token": 64,
        },
    ),
    "rds_rdma_notify": (16, {"user_token": 0, "status": 8}),
    "rds_zcopy_cookies": (36, {"num": 0, "cookies": 4}),
}

# Nested members checked with offsetof(type, a.b) in C.
NESTED: dict[str, list[tuple[str, str]]] = {
    "rds_atomic_args": [
        ("cswp.compare", "cswp"),
        ("cswp.swap", "cswp"),
        ("fadd.add", "fadd"),
        ("m_cswp.compare", "m_cswp"),
        ("m_cswp.swap", "m_cswp"),
        ("m_cswp.compare_mask", "m_cswp"),
        ("m_cswp.swap_mask", "m_cswp"),
        ("m_fadd.add", "m_fadd"),
        ("m_fadd.nocarry_mask", "m_fadd"),
    ],
    "rds_get_mr_args": [("vec.addr", "vec"), ("vec.bytes", "vec")],
    "rds_rdma_args": [("remote_vec.addr", "remote_vec"), ("remote_vec.bytes", "remote_vec")],
}


def _fields(cls: type[ctypes.Structure]) -> list[str]:
    names: list[str] = []
    for name, *_ in cls._fields_:
        if name in getattr(cls, "_anonymous_", ()):
            sub = dict(cls._fields_)[name]
            names.extend(n for n, *_ in sub._fields_)
        else:
            names.append(name)
    return names


def _py_offset(cls: type[ctypes.Structure], path: str) -> int:
    off = 0
    cur: type = cls
    for part in path.split("."):
        anon = getattr(cur, "_anonymous_", ())
        found = False
        for name in anon:
            sub = dict(cur._fields_)[name]  # type: ignore[attr-defined]
            if part in dict(sub._fields_):
                off += getattr(cur, name).offset + getattr(sub, part).offset
                cur = dict(sub._fields_)[part]
                found = True
                break
        if not found:
            off += getattr(cur, part).offset
            cur = dict(cur._fields_)[part]  # type: ignore[attr-defined]
    return off


def test_every_struct_is_listed() -> None:
    assert set(uapi.UAPI_STRUCTS) == set(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_layout(name: str) -> None:
    cls = uapi.UAPI_STRUCTS[name]
    size, offsets = PINNED[name]
    assert ctypes.sizeof(cls) == size
    assert set(_fields(cls)) == set(offsets)
    for field, off in offsets.items():
        assert _py_offset(cls, field) == off, field


def test_sockaddr_sizes() -> None:
    assert ctypes.sizeof(uapi.sockaddr_in) == 16
    assert ctypes.sizeof(uapi.sockaddr_in6) == 28
    assert ctypes.sizeof(uapi.sockaddr_storage) == 128
    assert ctypes.alignment(uapi.sockaddr_storage) == 8


def test_sockaddr_roundtrip() -> None:
    sa = uapi.make_sockaddr_in("10.1.2.3", 4000)
    assert uapi.parse_sockaddr(uapi.to_bytes(sa)) == ("10.1.2.3", 4000)
    sa6 = uapi.make_sockaddr_in6("fd00::1", 4001, 5, 7)
    assert uapi.parse_sockaddr(uapi.to_bytes(sa6)) == ("fd00::1", 4001, 5, 7)
    ss = uapi.make_sockaddr_storage("fd00::2", 9)
    assert uapi.parse_sockaddr(uapi.to_bytes(ss)) == ("fd00::2", 9, 0, 0)
    ss4 = uapi.make_sockaddr_storage("1.2.3.4", 9)
    assert uapi.parse_sockaddr(uapi.to_bytes(ss4)) == ("1.2.3.4", 9)


def test_cookie_helpers() -> None:
    c = uapi.rdma_cookie(0x1234, 0x10)
    assert c == 0x1234 | (0x10 << 32)
    assert uapi.rdma_cookie_key(c) == 0x1234
    assert uapi.rdma_cookie_offset(c) == 0x10
    with pytest.raises(ValueError):
        uapi.rdma_cookie(1 << 32)


def _c_program() -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#include <sys/socket.h>",
        "#include <netinet/in.h>",
        "#include <linux/rds.h>",
        "int main(void) {",
    ]
    for name in sorted(PINNED):
        lines.append(f'printf("{name} sizeof %zu\\n", sizeof(struct {name}));')
        fields = list(PINNED[name][1]) + [p for p, _ in NESTED.get(name, [])]
        for field in fields:
            lines.append(f'printf("{name} {field} %zu\\n", offsetof(struct {name}, {field}));')
    lines.append('printf("sockaddr_in sizeof %zu\\n", sizeof(struct sockaddr_in));')
    lines.append('printf("sockaddr_in6 sizeof %zu\\n", sizeof(struct sockaddr_in6));')
    lines.append('printf("sockaddr_storage sizeof %zu\\n", sizeof(struct __kernel_sockaddr_storage));')
    for f in ("sin6_family", "sin6_port", "sin6_flowinfo", "sin6_addr", "sin6_scope_id"):
        lines.append(f'printf("sockaddr_in6 {f} %zu\\n", offsetof(struct sockaddr_in6, {f}));')
    for f in ("sin_family", "sin_port", "sin_addr"):
        lines.append(f'printf("sockaddr_in {f} %zu\\n", offsetof(struct sockaddr_in, {f}));')
    lines.append("return 0; }")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], int]:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler: cannot prove the layout against linux/rds.h")
    if not HEADER.exists():
        pytest.skip(f"{HEADER} missing (install linux-libc-dev)")
    d = tmp_path_factory.mktemp("layout")
    src = d / "layout.c"
    exe = d / "layout"
    src.write_text(_c_program())
    subprocess.run([gcc, "-Wall", "-Werror", "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, env=dict(os.environ)).stdout
    result: dict[tuple[str, str], int] = {}
    for line in out.splitlines():
        sname, field, value = line.split()
        result[(sname, field)] = int(value)
    return result


@pytest.mark.parametrize("name", sorted(PINNED))
def test_layout_matches_real_header(name: str, c_layout: dict[tuple[str, str], int]) -> None:
    cls = uapi.UAPI_STRUCTS[name]
    assert ctypes.sizeof(cls) == c_layout[(name, "sizeof")], "sizeof"
    for field in PINNED[name][1]:
        assert _py_offset(cls, field) == c_layout[(name, field)], field
    for path, _top in NESTED.get(name, []):
        assert _py_offset(cls, path) == c_layout[(name, path)], path


def test_sockaddr_matches_real_header(c_layout: dict[tuple[str, str], int]) -> None:
    assert ctypes.sizeof(uapi.sockaddr_in) == c_layout[("sockaddr_in", "sizeof")]
    assert ctypes.sizeof(uapi.sockaddr_in6) == c_layout[("sockaddr_in6", "sizeof")]
    assert ctypes.sizeof(uapi.sockaddr_storage) == c_layout[("sockaddr_storage", "sizeof")]
    for f in ("sin6_family", "sin6_port", "sin6_flowinfo", "sin6_addr", "sin6_scope_id"):
        assert getattr(uapi.sockaddr_in6, f).offset == c_layout[("sockaddr_in6", f)]
    for f in ("sin_family", "sin_port", "sin_addr"):
        assert getattr(uapi.sockaddr_in, f).offset == c_layout[("sockaddr_in", f)]
