"""Multipath handshake (probe ping/pong with NPATHS and SPORT_IDX), path hashing and the who-dials rule.

Kernel behaviour (net/rds/send.c, recv.c, threads.c, tcp_connect.c, tcp_listen.c):

* The probe is a ping from ``RDS_FLAG_PROBE_PORT`` (1) to port 0 on path 0; its pong goes from port 0 to port
  1.  Both carry ``RDS_EXTHDR_NPATHS = RDS_MPATH_WORKERS``.  6.1/6.12 ``rds_send_probe`` also tries to add
  ``RDS_EXTHDR_GEN_NUM``, but their ``rds_message_add_extension`` refuses a second extension, so GEN_NUM never
  reaches the wire from them.  7.x puts NPATHS, GEN_NUM and ``RDS_EXTHDR_SPORT_IDX`` (8, one zero byte) on the
  probe and its pong.  The stack sends NPATHS then SPORT_IDX (:func:`probe_exthdrs`): SPORT_IDX last, because
  6.1 sizes type 8 as 0 bytes and then reads its 0x00 body as the end of the list.
* ``c_npaths = min(RDS_MPATH_WORKERS, peer value)`` when NPATHS is present, then ``max(c_npaths, 1)``.
* ``c_with_sport_idx`` (7.x) is set iff SPORT_IDX is on the probe/pong, re-evaluated at every one
  (:func:`peer_sport_idx`).  A peer that sends it dials path i from a source port with ``port % 8 == i``,
  and a 7.x acceptor then pairs an incoming connection with path ``sport % c_npaths``.
* ``RDS_MPATH_HASH(rs, n) = jhash_1word(port, rs_hash_initval) & (n - 1)``; ``rs_hash_initval`` is random per
  socket, so only the spread matters, not the exact value.
* ``IS_CANONICAL(laddr, faddr)``: the numerically smaller address dials and reconnects; the larger side's
  outgoing connection is dropped when it becomes established (a doorbell) and paths > 0 are only dialled by
  the smaller side.
"""

from __future__ import annotations

import ipaddress

from pyrds.constants import RDS_FLAG_PROBE_PORT, RDS_MPATH_WORKERS, ExtHeaderType
from pyrds.userspace.proto.header import ExtHeader

__all__ = [
    "AddressLike",
    "is_hs_probe",
    "jhash_1word",
    "negotiate_npaths",
    "path_for_port",
    "send_path_index",
    "peer_gen_num",
    "peer_sport_idx",
    "probe_exthdrs",
    "should_dial",
]

AddressLike = str | bytes | ipaddress.IPv4Address | ipaddress.IPv6Address

_M32 = 0xFFFFFFFF
_JHASH_INITVAL = 0xDEADBEEF


def is_hs_probe(sport: int, dport: int) -> bool:
    """``RDS_HS_PROBE``: the handshake ping (1 -> 0) or its pong (0 -> 1)."""
    return (sport == RDS_FLAG_PROBE_PORT and dport == 0) or (sport == 0 and dport == RDS_FLAG_PROBE_PORT)


def probe_exthdrs(npaths: int = RDS_MPATH_WORKERS) -> tuple[ExtHeader, ...]:
    """Extensions the stack puts on a probe ping/pong: NPATHS, then SPORT_IDX (see module doc)."""
    return (ExtHeader.npaths(npaths), ExtHeader.sport_idx())


def negotiate_npaths(exthdr: tuple[ExtHeader, ...], current: int = 0) -> int:
    """``rds_recv_hs_exthdrs``: the new ``c_npaths`` given the previous value ``current`` (0 = unknown)."""
    npaths = current
    for ext in exthdr:
        if ext.type == ExtHeaderType.NPATHS:
            npaths = min(RDS_MPATH_WORKERS, ext.values[0])
    return max(npaths, 1)


def peer_sport_idx(exthdr: tuple[ExtHeader, ...]) -> bool:
    """``c_with_sport_idx`` after a probe ping/pong with these extensions: SPORT_IDX is present."""
    return any(ext.type == ExtHeaderType.SPORT_IDX for ext in exthdr)


def peer_gen_num(exthdr: tuple[ExtHeader, ...]) -> int:
    """The GEN_NUM extension's value, 0 when absent (0 means 'unknown' to the kernel)."""
    gen = 0
    for ext in exthdr:
        if ext.type == ExtHeaderType.GEN_NUM:
            gen = ext.values[0]
    return gen


def _rol32(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def jhash_1word(a: int, initval: int) -> int:
    """Linux ``jhash_1word`` (include/linux/jhash.h): ``__jhash_nwords(a, 0, 0, initval + INITVAL + 4)``."""
    iv = (initval + _JHASH_INITVAL + (1 << 2)) & _M32
    a = (a + iv) & _M32
    b = iv
    c = iv
    # __jhash_final
    c ^= b
    c = (c - _rol32(b, 14)) & _M32
    a ^= c
    a = (a - _rol32(c, 11)) & _M32
    b ^= a
    b = (b - _rol32(a, 25)) & _M32
    c ^= b
    c = (c - _rol32(b, 16)) & _M32
    a ^= c
    a = (a - _rol32(c, 4)) & _M32
    b ^= a
    b = (b - _rol32(a, 14)) & _M32
    c ^= b
    c = (c - _rol32(b, 24)) & _M32
    return c


def path_for_port(port: int, npaths: int, initval: int = 0) -> int:
    """Path index for a socket bound to ``port`` (``RDS_MPATH_HASH``); ``npaths`` must be a power of two.

    ``npaths`` 0 (handshake not done) hashes over ``RDS_MPATH_WORKERS`` like 6.1's ``rds_send_mprds_hash``;
    the caller then sends on path 0 until the handshake completes (7.x hashes over ``c_npaths ?: 1``, i.e.
    path 0 too).  The port is hashed in host order (the post-2025 kernel; 6.1 hashes the big-endian bytes,
    which only changes which port lands where).
    """
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} out of range")
    n = RDS_MPATH_WORKERS if npaths == 0 else npaths
    if n < 1 or n & (n - 1) or n > RDS_MPATH_WORKERS:
        raise ValueError(f"npaths {npaths} must be a power of two <= {RDS_MPATH_WORKERS}")
    return _mpath_hash(port, initval, n)


def send_path_index(port: int, npaths: int, initval: int) -> int:
    """The path a sender hashes to for a negotiated ``npaths`` (0: unknown yet, hash over
    ``RDS_MPATH_WORKERS``): :func:`path_for_port`, except that a count that is not a power of two (which only
    an unusual peer advertises) is reduced with ``%`` instead of being refused."""
    return _mpath_hash(port, initval, npaths or RDS_MPATH_WORKERS)


def _mpath_hash(port: int, initval: int, n: int) -> int:
    """``RDS_MPATH_HASH``: the one path hash of the stack (jhash in Python costs ~30 operations; a socket
    sends to few ports, so the hashes are remembered, a bounded number)."""
    key = (port, initval)
    h = _hashes.get(key)
    if h is None:
        if len(_hashes) >= _HASHES_MAX:
            _hashes.clear()
        h = _hashes[key] = jhash_1word(port, initval & _M32)
    return h & (n - 1) if n & (n - 1) == 0 else h % n


_hashes: dict[tuple[int, int], int] = {}
_HASHES_MAX = 4096


def _packed(addr: AddressLike) -> bytes:
    if isinstance(addr, bytes):
        if len(addr) not in (4, 16):
            raise ValueError("packed address must be 4 or 16 bytes")
        return addr
    ip = ipaddress.ip_address(addr) if isinstance(addr, str) else addr
    return ip.packed


def should_dial(laddr: AddressLike, faddr: AddressLike) -> bool:
    """``IS_CANONICAL(laddr, faddr)``: True when this side owns the connection (dials, reconnects)."""
    lp, fp = _packed(laddr), _packed(faddr)
    if len(lp) != len(fp):
        raise ValueError("laddr and faddr are of different address families")
    return lp < fp
