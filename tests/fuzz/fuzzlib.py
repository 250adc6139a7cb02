"""Fuzzing the userspace stack service with hostile bytes, shared by the full run (``tox -e fuzz``,
tests/fuzz/test_fuzz_service.py) and its bounded variant in the quick suite (tests/unit/test_fuzz_quick.py).

Three drivers, each deterministic for a seed and bounded in count and wall time:

- :func:`fuzz_control`: random and mutated control records (rpc.py/values.py) over real AF_UNIX SOCK_SEQPACKET
  connections to a live, isolated service; many records per connection, a new connection when the service
  drops one; between batches a bound pair of ``pyrds.socket("userspace")`` on 127.0.0.1 exchanges a message.
- :func:`fuzz_wire`: random and mutated RDS/TCP streams over real TCP connections to the RDS/TCP listener of a
  live service in a network namespace of its own (the service refuses peers whose address is local to its
  namespace, so 127.0.0.x sources would only exercise the refusal: the streams come from a second namespace
  over a veth); between batches a well-formed message must reach a socket bound on the veth address, and the
  127.0.0.1 pair must still talk.
- :func:`fuzz_pathengine`: the same streams fed to :class:`pyrds.userspace.proto.PathEngine` directly (no
  sockets), in random chunks; any exception but ProtocolError is a crash.

The live drivers check that the service's pid never changes and sample its RSS (/proc/PID/status VmRSS)
after every batch; a reply (or a dropped connection) that does not come within :data:`REPLY_TIMEOUT` is a
hang. Each returns a :class:`Stats`; the tests assert on it and print it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import select
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyrds.constants import RDS_CONG_MAP_BYTES, RDS_HEADER_SIZE, RDS_MAX_MSG_SIZE, HeaderFlag
from pyrds.userspace import rpc, values
from pyrds.userspace.proto import ExtHeader, PathEngine, ProtocolError

#: a reply (or the dropped connection) must come within this many seconds, else it is a hang
REPLY_TIMEOUT = 10.0
#: the documented bound on the service's resident memory during a fuzz run (VmRSS)
RSS_LIMIT_KB = 200 * 1024
#: issue 8: one 48-byte control record that made ``marshal.loads`` segfault the service
CRASH_RECORD = bytes.fromhex(
    "2902e904000000a803000000672281d86d9181d63ffa033a3a315b020000005b000000007b7201000000720100000030"
)

_UCRED = struct.Struct("3i")
OPEN_RECORD = rpc.encode((int(rpc.Op.OPEN), ()))
BIND_RECORD = rpc.encode((int(rpc.Op.BIND), ("127.0.0.1", 0, 0)))


def env_count(default: int) -> int:
    """``PYRDS_FUZZ_COUNT`` when set, else ``default``."""
    raw = os.environ.get("PYRDS_FUZZ_COUNT")
    return int(raw) if raw else default


@dataclass
class Stats:
    what: str
    count: int = 0  # inputs sent (records, or wire messages/garbage chunks)
    answered: int = 0  # control: replies
    dropped: int = 0  # connections the service dropped (control) or closed (wire)
    connections: int = 0
    batches: int = 0
    hangs: int = 0
    crashes: list[str] = field(default_factory=list)
    pid: int = 0
    rss_kb: list[int] = field(default_factory=list)
    seconds: float = 0.0
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def max_rss_kb(self) -> int:
        return max(self.rss_kb, default=0)

    def line(self) -> str:
        rate = self.count / self.seconds if self.seconds else 0.0
        parts = [
            f"{self.what}: {self.count} inputs in {self.seconds:.1f} s ({rate:.0f}/s)",
            f"{self.connections} connections",
        ]
        if self.answered:
            parts.append(f"{self.answered} answered")
        parts.append(f"{self.dropped} dropped")
        if self.pid:
            first = self.rss_kb[0] if self.rss_kb else 0
            parts.append(f"service pid {self.pid} RSS {first // 1024}->{self.max_rss_kb // 1024} MB max")
        parts.append(f"{self.hangs} hangs, {len(self.crashes)} crashes")
        parts += [f"{k} {v}" for k, v in sorted(self.extra.items())]
        return ", ".join(parts)


# ---------------------------------------------------------------------------------------------- service


def peer_pid(sock: socket.socket) -> int:
    pid, _uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(pid)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextlib.contextmanager
def isolated_stack_env(tcp_port: int | None = None) -> Iterator[str]:
    """A unique PYRDS_STACK_NAME (and RDS/TCP port) for this run; the service idles out 2 s after the run."""
    name = f"pyrds-fuzz-{uuid.uuid4().hex[:12]}"
    port = tcp_port if tcp_port is not None else 20000 + int(name[-4:], 16) % 20000
    saved = {k: os.environ.get(k) for k in ("PYRDS_STACK_NAME", "PYRDS_TCP_PORT", "PYRDS_IDLE_EXIT")}
    os.environ.update(PYRDS_STACK_NAME=name, PYRDS_TCP_PORT=str(port), PYRDS_IDLE_EXIT="2")
    try:
        yield name
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class HealthPair:
    """Two userspace RDS sockets bound on 127.0.0.1 (created in the calling thread's namespace): they must
    exchange a message whenever :meth:`check` is called. Creating the first one starts the service."""

    def __init__(self) -> None:
        import pyrds

        self.a = pyrds.socket("userspace")
        self.b = pyrds.socket("userspace")
        self.a.bind(("127.0.0.1", 0))
        self.b.bind(("127.0.0.1", 0))
        self.b.settimeout(REPLY_TIMEOUT)
        self.n = 0

    def check(self) -> None:
        """A's next message reaches B. Messages from other sources are skipped: a fuzzed record may send to
        B's port (seen once in 1,000,000 control records: b'payload' arrived before the check's message)."""
        self.n += 1
        payload = b"still here %d" % self.n
        self.a.sendto(payload, self.b.getsockname())
        me = self.a.getsockname()
        while True:
            got, src = self.b.recvfrom(100)
            if src == me:
                break
        assert got == payload, (got, payload)

    def service_pid(self) -> int:
        from pyrds.userspace.config import stack_address

        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(stack_address())
            return peer_pid(s)
        finally:
            s.close()

    def close(self) -> None:
        self.a.close()
        self.b.close()


# ------------------------------------------------------------------------------------- control records

_BOUNDARY_INTS = [
    0,
    1,
    -1,
    2,
    255,
    256,
    65535,
    65536,
    2**31 - 1,
    2**31,
    -(2**31),
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    -(2**63),
    2**64,
    2**255 - 1,
    -(2**255) + 1,
]
_U32_BOUNDS = [0, 1, 2, 3, 4, 7, 8, 16, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]
_STRINGS = [
    "",
    "127.0.0.1",
    "::1",
    "0.0.0.0",
    "::",
    "10.0.0.1",
    "fe80::1%lo",
    "999.1.1.1",
    "x" * 300,
    "ping_enable",
    "rds_tcp_sndbuf",
    "rds_tcp_rcvbuf",
    "reconnect_min_delay_ms",
    "nope",
    "\u00e9\u4e2d",
]


def _rand_value(rng: random.Random, depth: int = 0) -> Any:
    k = rng.randrange(12 if depth < 3 else 8)
    if k == 0:
        return None
    if k == 1:
        return rng.random() < 0.5
    if k in (2, 3):
        return rng.choice(_BOUNDARY_INTS) if rng.random() < 0.5 else rng.randrange(-70000, 70000)
    if k == 4:
        return rng.choice([0.0, -1.5, float("inf"), float("-inf"), float("nan"), 1e308])
    if k == 5:
        return rng.randbytes(rng.choice([0, 1, 4, 16, 28, 100]))
    if k in (6, 7):
        return rng.choice(_STRINGS)
    items = [_rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if k in (8, 9):
        return tuple(items)
    if k == 10:
        return items
    return {rng.choice([0, 1, "a", None, b"k"]): v for v in items}


def _cmsg_list(rng: random.Random) -> list[Any]:
    return [
        (
            rng.choice([276, 1, 0, -1, 2**31]),
            rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 99]),
            rng.randbytes(rng.choice([0, 4, 8, 16, 24, 48, 64])),
        )
        for _ in range(rng.randrange(0, 3))
    ]


def control_seeds(rng: random.Random, port: int = 4242) -> list[bytes]:
    """Well-formed requests of every operation (values records, SEND and RECV binary records)."""
    op = rpc.Op
    v = [
        (op.OPEN, ()),
        (op.BIND, ("127.0.0.1", port, 0)),
        (op.BIND, ("::1", 0, 0)),
        (op.CONNECT, ("127.0.0.1", port, False)),
        (op.SEND, (b"payload", [], 0, ("127.0.0.1", port), True)),
        (op.RECV, (100, 0, 0, True)),
        (op.SETSOCKOPT, (1, 7, 65536)),  # SO_SNDBUF
        (op.SETSOCKOPT, (1, 8, 1 << 20)),  # SO_RCVBUF
        (op.SETSOCKOPT, (276, 6, b"\0" * 4)),
        (op.SETSOCKOPT, (276, 1, struct.pack("=HH4s8x", 2, port, socket.inet_aton("127.0.0.1")))),
        (op.GETSOCKOPT, (276, 6, 4)),
        (op.GETSOCKOPT, (1, 7, 4)),
        (op.GETSOCKNAME, ()),
        (op.GETPEERNAME, ()),
        (op.INFO, (10000,)),
        (op.INFO, (10007,)),
        (op.SET_TOS, (3,)),
        (op.GET_TOS, ()),
        (op.SYSCTL_GET, ()),
        (op.SYSCTL_SET, ("reconnect_min_delay_ms", 1000)),
        (op.SYSCTL_SET, ("ping_enable", 1)),
        (op.DEBUG, ()),
    ]
    out = [rpc.encode((int(o), a)) for o, a in v]
    for dlen, addr in (
        (4, socket.inet_aton("127.0.0.1")),
        (16, socket.inet_pton(socket.AF_INET6, "::1")),
        (0, b""),
    ):
        anc = rpc.encode(_cmsg_list(rng)) if rng.random() < 0.5 else b""
        out.append(rpc.SEND_REQ.pack(rpc.TAG_SEND, 0, 1, dlen, port, len(anc)) + addr + anc + b"data")
    out.append(rpc.RECV_REQ.pack(rpc.TAG_RECV, 100, 64, 0, 1))
    out.append(rpc.RECV_REQ.pack(rpc.TAG_RECV, 0, 0, 0x40, 1))  # MSG_DONTWAIT
    out.append(CRASH_RECORD)
    return out


def _encode(value: Any) -> bytes:
    try:
        return values.encode(value)
    except (TypeError, ValueError, OverflowError):
        return b"N"


def _bad_values_record(rng: random.Random) -> bytes:
    """A well-formed values record with bad values: a real operation, wrong or extreme arguments."""
    opnum = rng.choice([*range(0, 17), -1, 2**31, 2**64]) if rng.random() < 0.9 else _rand_value(rng)
    if rng.random() < 0.8:
        args: Any = tuple(_rand_value(rng) for _ in range(rng.randrange(0, 6)))
    else:
        args = _rand_value(rng)
    try:
        if rng.random() < 0.05:
            return rpc.encode(_rand_value(rng))  # not even (op, args)
        return rpc.encode((opnum, args))
    except (TypeError, ValueError, OverflowError):
        return rpc.encode((0, ()))


def _binary_record(rng: random.Random, port: int) -> bytes:
    """SEND/RECV binary records with length fields at their boundaries and bad values."""
    if rng.random() < 0.5:
        dlen = rng.choice([0, 1, 3, 4, 5, 15, 16, 17, 255])
        addr = (
            rng.randbytes(dlen) if rng.random() < 0.3 else (socket.inet_aton("127.0.0.1") + bytes(12))[:dlen]
        )
        anc = b""
        if rng.random() < 0.4:
            anc = rpc.encode(_cmsg_list(rng)) if rng.random() < 0.7 else _encode(_rand_value(rng))
        alen = len(anc) if rng.random() < 0.7 else rng.choice(_U32_BOUNDS)
        payload = rng.randbytes(rng.choice([0, 1, 8, 100, 1500, 9000, 70000]))
        flags = rng.choice([0, 0x40, 0x8000000, -1, 2**31 - 1, -(2**31), rng.getrandbits(31)])
        return (
            struct.pack(
                "<BiBBHI",
                rpc.TAG_SEND,
                flags,
                rng.choice([0, 1, 2, 255]),
                dlen,
                rng.choice([0, 1, port, 65535]),
                alen,
            )
            + addr
            + anc
            + payload
        )
    big = [0, 1, -1, 100, 2**31, 2**62, 2**63 - 1, -(2**63)]
    return struct.pack(
        "<BqqiB",
        rpc.TAG_RECV,
        rng.choice(big),
        rng.choice(big),
        rng.choice([0, 0x40, 0x1, 0x2, 0x20, -1, 2**31 - 1]),
        rng.choice([0, 1, 255]),
    )


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    buf = bytearray(raw)
    for _ in range(rng.randrange(1, 4)):
        k = rng.randrange(6)
        if k == 0 and buf:  # bit flip
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif k == 1 and buf:  # byte set
            buf[rng.randrange(len(buf))] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.getrandbits(8)])
        elif k == 2 and buf:  # truncate
            del buf[rng.randrange(len(buf)) :]
        elif k == 3:  # a u32 length at a boundary, inserted or overwritten
            at = rng.randrange(len(buf) + 1)
            word = struct.pack("<I", rng.choice(_U32_BOUNDS))
            if rng.random() < 0.5:
                buf[at:at] = word
            else:
                buf[at : at + 4] = word
        elif k == 4 and buf:  # duplicate a slice
            a = rng.randrange(len(buf))
            b = rng.randrange(a, min(len(buf), a + 64) + 1)
            buf[b:b] = buf[a:b]
        elif k == 5:  # trailing garbage
            buf += rng.randbytes(rng.randrange(1, 9))
    return bytes(buf)


def _stops_the_service(record: bytes) -> bool:
    """Whether the service would read ``record`` as STOP (``pyrds stack stop``): the fuzzer runs as root, for
    whom that is a legitimate request, and the run checks that one service survives every record."""
    try:
        request = rpc.decode(record)
    except Exception:  # noqa: BLE001 - anything the service would drop
        return False
    return isinstance(request, tuple) and len(request) > 0 and request[0] == int(rpc.Op.STOP)


def control_record(rng: random.Random, seeds: list[bytes], port: int) -> bytes:
    while True:
        record = _control_record(rng, seeds, port)
        if not _stops_the_service(record):
            return record


def _control_record(rng: random.Random, seeds: list[bytes], port: int) -> bytes:
    kind = rng.random()
    if kind < 0.08:
        return rng.randbytes(rng.randrange(0, 100))
    if kind < 0.3:
        return _mutate(rng, rng.choice(seeds))
    if kind < 0.5:
        return rng.choice(seeds)
    if kind < 0.75:
        rec = _bad_values_record(rng)
    else:
        rec = _binary_record(rng, port)
    return _mutate(rng, rec) if rng.random() < 0.3 else rec


def packets(rng: random.Random, record: bytes) -> list[bytes]:
    """The packets that carry ``record``: usually one (flag LAST), sometimes split (MORE...LAST), with an
    odd flag byte, a record over the service's 4 MiB limit, or an empty packet."""
    k = rng.random()
    if k < 0.85:
        return [b"\x00" + record]
    if k < 0.93 and len(record) > 1:
        cuts = sorted(rng.sample(range(1, len(record)), min(len(record) - 1, rng.randrange(1, 4))))
        parts = [record[a:b] for a, b in zip([0, *cuts], [*cuts, len(record)], strict=True)]
        return [b"\x01" + p for p in parts[:-1]] + [b"\x00" + parts[-1]]
    if k < 0.985:
        return [bytes([rng.choice([2, 0x80, 0xFF, rng.getrandbits(8)])]) + record]
    if k < 0.9995:
        return [b"\x01" + record, b"\x00"]  # a MORE packet then an empty LAST packet
    if k < 0.99997:
        return [b""]  # an empty packet: reads as EOF
    chunk = b"\x01" + bytes(200 * 1024)
    return [chunk] * 21 + [b"\x00"]  # 4.1 MiB: over the service's record limit


def _recv_reply(s: socket.socket) -> bool:
    """Read one whole reply (closing any passed fd); False when the service dropped the connection."""
    deadline = time.monotonic() + REPLY_TIMEOUT
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([s], [], [], left)[0]:
            raise TimeoutError("no reply")
        try:
            data, anc, _flags, _addr = s.recvmsg(rpc.MAX_PACKET + 1, socket.CMSG_SPACE(16))
        except (ConnectionResetError, BrokenPipeError):
            return False
        for level, kind, blob in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                for (fd,) in struct.iter_unpack("i", blob[: len(blob) - len(blob) % 4]):
                    os.close(fd)
        if not data:
            return False
        if data[0] != rpc.MORE:
            return True


def notice_kind(record: bytes) -> str | None:
    """The counter of a record (as the service assembled it) that the service answers with nothing: "posts"
    for a POST, "consumed_notices" for a well-formed CONSUMED whose ``reply`` is 0 (a malformed one drops the
    connection, which the next record shows); None for a record that is answered."""
    if record[:1] == bytes([rpc.TAG_POST]):
        return "posts"
    if record[:1] == bytes([rpc.TAG_CONSUMED]) and len(record) in (rpc.CONSUMED.size, rpc.CONSUMED_V1.size):
        _tag, _count, _drained, reply = rpc.CONSUMED_V1.unpack_from(record)
        return None if reply else "consumed_notices"
    return None


def control_accounted(st: Stats) -> int:
    """The control records of a run that had an outcome: answered, dropped, left incomplete, or notices."""
    extra = st.extra
    notices = extra.get("posts", 0) + extra.get("consumed_notices", 0)
    return st.answered + st.dropped + extra.get("incomplete", 0) + notices


def _control_conn(addr: bytes) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    s.settimeout(REPLY_TIMEOUT)
    s.connect(addr)
    return s


def fuzz_control(
    count: int,
    seed: int = 0x5EED,
    batch: int = 5000,
    max_seconds: float = 3600.0,
    per_conn: int = 500,
    progress: Callable[[Stats], None] | None = None,
) -> Stats:
    """``count`` control records against the live service of this namespace (the caller isolates it with
    :func:`isolated_stack_env`). Stops (and reports a hang) at the first record left without reply or drop."""
    from pyrds.userspace.config import stack_address

    rng = random.Random(seed)
    st = Stats("control")
    health = HealthPair()
    start = time.monotonic()
    try:
        health.check()
        st.pid = health.service_pid()
        st.rss_kb.append(rss_kb(st.pid))
        port = health.b.getsockname()[1] + 1
        seeds = control_seeds(rng, port)
        addr = stack_address()
        s: socket.socket | None = None
        used = 0
        setup: list[bytes] = []
        pending = b""  # records sent so far whose last packet said MORE: the service joins the next one on
        while st.count < count:
            for _ in range(min(batch, count - st.count)):
                if s is None or used >= per_conn:
                    if s is not None:
                        s.close()
                    s = _control_conn(addr)
                    st.connections += 1
                    used = 0
                    pending = b""
                    # most connections open their RDS socket first (and some bind it), so that what follows
                    # reaches the operations' handlers instead of stopping at EBADF; these count as inputs
                    setup = [OPEN_RECORD] if rng.random() < 0.9 else []
                    if setup and rng.random() < 0.5:
                        setup.append(BIND_RECORD)
                rec = setup.pop(0) if setup else control_record(rng, seeds, port)
                st.count += 1
                used += 1
                alive = True
                try:
                    for p in packets(rng, rec):
                        s.send(p)
                    if p[:1] == b"\x01":
                        st.extra["incomplete"] = st.extra.get("incomplete", 0) + 1
                        pending += rec
                        continue  # the record is not complete: no reply yet (the next one continues it)
                    assembled, pending = pending + rec, b""
                    kind = notice_kind(assembled)
                    if kind is not None:
                        # a notice (POST, CONSUMED without reply) is never answered: the next record (or the
                        # health check) shows whether the service took it or dropped the connection
                        st.extra[kind] = st.extra.get(kind, 0) + 1
                        continue
                    alive = _recv_reply(s)
                except (BrokenPipeError, ConnectionResetError):
                    alive = False
                except TimeoutError:
                    st.hangs += 1
                    st.crashes.append(f"no reply to record {st.count}: {rec[:64].hex()}")
                    return st
                except OSError as exc:
                    if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                        raise
                    alive = False
                if alive:
                    st.answered += 1
                else:
                    st.dropped += 1
                    s.close()
                    s = None
            st.batches += 1
            health.check()
            if health.service_pid() != st.pid:
                st.crashes.append(f"service restarted: pid {st.pid} -> {health.service_pid()}")
                return st
            st.rss_kb.append(rss_kb(st.pid))
            st.seconds = time.monotonic() - start
            if progress is not None:
                progress(st)
            if st.seconds > max_seconds:
                break
        if s is not None:
            s.close()
        health.check()
        st.rss_kb.append(rss_kb(st.pid))
    finally:
        health.close()
        st.seconds = time.monotonic() - start
    return st


# ---------------------------------------------------------------------------------------------- the wire

_FLAG_CHOICES = [
    0,
    0,
    0,
    int(HeaderFlag.CONG_BITMAP),
    int(HeaderFlag.ACK_REQUIRED),
    int(HeaderFlag.RETRANSMITTED),
    int(HeaderFlag.RETRANSMITTED | HeaderFlag.ACK_REQUIRED),
    int(HeaderFlag.CONG_BITMAP | HeaderFlag.RETRANSMITTED),
    0xFF,
]
_SEQ_BOUNDS = [0, 1, 2, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
_PORTS = [0, 0, 1, 1, 2, 4000, 5000, 16385, 32768, 65535]
_CONG_LENS = [0, 1, 8, RDS_CONG_MAP_BYTES - 1, RDS_CONG_MAP_BYTES + 1, 2 * RDS_CONG_MAP_BYTES]


def _exthdr_area(rng: random.Random) -> bytes:
    k = rng.random()
    if k < 0.5:
        return bytes(16)
    if k < 0.8:
        exts = []
        for _ in range(rng.randrange(1, 4)):
            t = rng.randrange(7)
            if t == 0:
                exts.append(ExtHeader.npaths(rng.choice([0, 1, 2, 7, 8, 9, 255, 65535])))
            elif t == 1:
                exts.append(ExtHeader.gen_num(rng.choice([0, 1, 2, 2**32 - 1, rng.getrandbits(32)])))
            elif t == 2:
                exts.append(ExtHeader.sport_idx())
            elif t == 3:
                exts.append(ExtHeader.version(rng.getrandbits(32)))
            elif t == 4:
                exts.append(ExtHeader.rdma(rng.getrandbits(32)))
            elif t == 5:
                exts.append(ExtHeader.rdma_dest(rng.getrandbits(32), rng.getrandbits(32)))
            else:
                exts.append(ExtHeader(rng.choice([4, 7, 9, 12, 15])))
        raw = bytearray()
        for e in exts:
            raw.append(e.type)
            raw += e.body
        return bytes(raw[:16]).ljust(16, b"\0")
    if k < 0.95:
        # types and "lengths" at the edges: a type whose body runs past the area, unknown types, 16+
        raw = bytearray(
            rng.choice([1, 2, 3, 5, 6, 8, 15, 16, 0xFF]) if rng.random() < 0.8 else 0 for _ in range(16)
        )
        return bytes(raw)
    return rng.randbytes(16)


def _raw_header(
    seq: int,
    ack: int,
    length: int,
    sport: int,
    dport: int,
    flags: int,
    credit: int,
    pad: bytes,
    csum: int,
    ext: bytes,
) -> bytes:
    return struct.pack(">QQIHHBB4sH16s", seq, ack, length, sport, dport, flags, credit, pad, csum, ext)


class WireGen:
    """RDS/TCP inputs: a stream of messages (valid headers with mutated fields), each one "input"."""

    def __init__(self, rng: random.Random, dport: int = 5000, max_payload: int = 2048) -> None:
        self.rng = rng
        self.seq = 1
        self.dport = dport
        self.max_payload = max_payload

    def message(self) -> bytes:
        """One message: usually framed right (h_len == the payload), with odd header fields."""
        rng = self.rng
        k = rng.random()
        flags = rng.choice(_FLAG_CHOICES) if rng.random() < 0.9 else rng.getrandbits(8)
        if flags == HeaderFlag.CONG_BITMAP and rng.random() < 0.7:
            length = RDS_CONG_MAP_BYTES if rng.random() < 0.5 else rng.choice(_CONG_LENS)
            payload = rng.randbytes(length) if rng.random() < 0.2 else bytes(length)
            return _raw_header(0, 0, length, 0, 0, flags, 0, bytes(4), 0, bytes(16)) + payload
        if k < 0.6:
            self.seq = (self.seq + 1) & (2**64 - 1)
            seq = self.seq
        elif k < 0.8:
            seq = max(0, self.seq - rng.randrange(0, 5))  # a duplicate or old sequence number
        else:
            seq = rng.choice(_SEQ_BOUNDS) if rng.random() < 0.7 else rng.getrandbits(64)
        if rng.random() < 0.1:
            self.seq = seq
        size = (
            rng.choice([0, 0, 1, 7, 48, 100, 1000, self.max_payload])
            if rng.random() < 0.9
            else rng.randrange(self.max_payload + 1)
        )
        payload = rng.randbytes(min(size, 64)) * (size // 64 + 1)
        payload = payload[:size]
        sport = rng.choice(_PORTS) if rng.random() < 0.7 else rng.getrandbits(16)
        dport = (
            self.dport
            if rng.random() < 0.05
            else (rng.choice(_PORTS) if rng.random() < 0.7 else rng.getrandbits(16))
        )
        head = _raw_header(
            seq,
            rng.choice([0, rng.getrandbits(64)]),
            size,
            sport,
            dport,
            flags,
            rng.choice([0, 0, 1, 255]),
            bytes(4) if rng.random() < 0.9 else rng.randbytes(4),
            rng.choice([0, 0, 0xFFFF]),
            _exthdr_area(rng),
        )
        return head + payload

    def bad(self) -> bytes:
        """Input that should poison a stream: h_len over the limit, a truncated header, or garbage."""
        rng = self.rng
        k = rng.random()
        if k < 0.4:
            length = rng.choice(
                [RDS_MAX_MSG_SIZE + 1, 2**31, 2**32 - 1, rng.randrange(RDS_MAX_MSG_SIZE + 1, 2**32)]
            )
            return _raw_header(self.seq, 0, length, 4, 5, 0, 0, bytes(4), 0, bytes(16))
        if k < 0.6:
            return self.message()[: rng.randrange(1, RDS_HEADER_SIZE)]
        if k < 0.8:  # a header whose h_len promises more than is sent before the stream ends
            return _raw_header(
                self.seq, 0, rng.randrange(1, 65536), 4, 5, 0, 0, bytes(4), 0, bytes(16)
            ) + rng.randbytes(rng.randrange(0, 64))
        return rng.randbytes(rng.randrange(1, 4096))

    def mutated(self, msg: bytes) -> bytes:
        """``msg`` with bytes of its header flipped (which can change its length: the stream may desync)."""
        rng = self.rng
        buf = bytearray(msg)
        for _ in range(rng.randrange(1, 3)):
            i = rng.randrange(min(len(buf), RDS_HEADER_SIZE))
            buf[i] ^= 1 << rng.randrange(8)
        return bytes(buf)

    def stream(self) -> list[bytes]:
        """The inputs of one connection: messages (some mutated), maybe ending in bad input."""
        rng = self.rng
        out: list[bytes] = []
        n = rng.choice([1, 2, 5, 20, 50, 100, 200])
        for _ in range(n):
            msg = self.message()
            if rng.random() < 0.02:
                msg = self.mutated(msg)
            out.append(msg)
        if rng.random() < 0.3:
            out.append(self.bad())
        if rng.random() < 0.05:
            out.insert(rng.randrange(len(out) + 1), self.bad())
        return out


def fuzz_pathengine(count: int, seed: int = 0xF00D, max_seconds: float = 3600.0) -> Stats:
    """``count`` wire inputs fed to PathEngine.feed in random chunks; only ProtocolError may come out."""
    rng = random.Random(seed)
    gen = WireGen(rng, max_payload=9000)
    st = Stats("pathengine")
    start = time.monotonic()
    eng = _engine(rng)
    now = 0.0
    while st.count < count:
        inputs = gen.stream()
        data = b"".join(inputs)
        st.count += len(inputs)
        st.connections += 1
        pos = 0
        try:
            while pos < len(data):
                step = rng.choice([1, 7, 48, 49, 1000, 65536, len(data)])
                now += 0.001
                eng.feed(data[pos : pos + step], now)
                pos += step
                buffered = eng.framer.buffered
                assert buffered <= RDS_HEADER_SIZE + eng.max_len, buffered
                if rng.random() < 0.05:
                    eng.bytes_to_send(rng.choice([None, 1, 100000]))
                    eng.acked_through(rng.randrange(eng.tx_bytes + 1))
        except ProtocolError:
            st.dropped += 1
            assert eng.state.name == "ERROR"
        except Exception as exc:  # a crash: report it with the input that caused it
            st.crashes.append(f"{type(exc).__name__}: {exc} after {pos} bytes of {data[:200].hex()}")
            eng = _engine(rng)
            continue
        if rng.random() < 0.7:
            eng.connection_lost(now)
            eng.connection_made(now)
        else:
            eng = _engine(rng)
        if time.monotonic() - start > max_seconds:
            break
    st.seconds = time.monotonic() - start
    return st


def _engine(rng: random.Random) -> PathEngine:
    import ipaddress

    index = rng.randrange(8)
    lane0 = (
        PathEngine(ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("10.0.0.2"), 0) if index else None
    )
    eng = PathEngine(
        ipaddress.ip_address("10.0.0.1"),
        ipaddress.ip_address("10.0.0.2"),
        index,
        ping_enable=rng.random() < 0.9,
        max_len=rng.choice([RDS_MAX_MSG_SIZE, 4096]),
        max_queued_msgs=rng.choice([None, 4, 64]),
        lane0=lane0,
    )
    eng.connecting(0.0)
    eng.connection_made(0.0)
    return eng


def _drain_until_eof(s: socket.socket, deadline: float) -> str:
    """Read what the service sends until it closes: "eof", "reset", or "timeout"."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        s.settimeout(left)
        try:
            if not s.recv(65536):
                return "eof"
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        except TimeoutError:
            return "timeout"


def send_stream(s: socket.socket, inputs: list[bytes], rng: random.Random) -> bool:
    """Send the inputs (in one write or in random pieces); False when the service stopped reading for
    REPLY_TIMEOUT (a hang)."""
    data = b"".join(inputs)
    try:
        if rng.random() < 0.2 and len(data) > 1:
            pos = 0
            while pos < len(data):
                step = rng.randrange(1, 4096)
                s.sendall(data[pos : pos + step])
                pos += step
        else:
            s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        pass  # the service dropped the stream at a bad header while we were still sending
    except TimeoutError:
        return False
    return True


def linger_close(s: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): no TIME_WAIT on the fuzzer's side, a million connections fit."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@dataclass
class WireService:
    """A live service alone in namespace ``dst_ns`` (RDS/TCP on ``dst``:``port``), reached over a veth
    from the sources in ``src_ns``; ``health`` (127.0.0.1) and ``sink`` (bound on ``dst``) live in its
    namespace."""

    src_ns: str
    srcs: list[str]
    dst_ns: str
    dst: str
    port: int
    health: HealthPair
    sink: Any
    pid: int


@contextlib.contextmanager
def wire_service(subnet: str = "10.88.0", nsrcs: int = 8) -> Iterator[WireService]:
    """Two fresh namespaces joined by a veth (root): the service's (``<subnet>.200``, the larger address,
    so the service never dials the fuzzer: it only accepts) and the fuzzer's (``<subnet>.1..nsrcs``). At
    exit the service gets SIGTERM and both namespaces are deleted."""
    from pyrds import netns

    srcs = [f"{subnet}.{i}" for i in range(1, nsrcs + 1)]
    dst = f"{subnet}.200"
    a, b = netns.unique_name("fzA"), netns.unique_name("fzB")
    netns.create_netns(a)
    netns.create_netns(b)
    try:
        netns.create_veth(a, b, "va", "vb", addrs_a=[f"{s}/24" for s in srcs], addrs_b=[f"{dst}/24"])
        with isolated_stack_env(tcp_port=16385):

            def setup() -> tuple[HealthPair, Any, int]:
                import pyrds

                health = HealthPair()
                sink = pyrds.socket("userspace")
                sink.bind((dst, 5000))
                return health, sink, health.service_pid()

            health, sink, pid = netns.run_in_netns(b, setup)
            try:
                yield WireService(a, srcs, b, dst, 16385, health, sink, pid)
            finally:
                sink.close()
                health.close()
    finally:
        for ns in (a, b):
            for pid in netns.netns_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 15)
            netns.delete_netns(ns)


def _tcp(svc: WireService, rng: random.Random) -> socket.socket:
    """A TCP connection to the service from a random source address (and sometimes a path-tag-shaped or
    fixed source port); must be called on a thread inside ``svc.src_ns``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    src = rng.choice(svc.srcs)
    sport = 0
    if rng.random() < 0.1:
        sport = rng.randrange(32768, 61000)
        if rng.random() < 0.5:
            sport = (sport & ~0xFF) | 0xA8 | rng.randrange(8)
    try:
        s.bind((src, sport))
    except OSError:
        s.bind((src, 0))
    s.settimeout(REPLY_TIMEOUT)
    s.connect((svc.dst, svc.port))
    return s


def _deliver(svc: WireService, n: int) -> None:
    """A well-formed message from the fuzzer's namespace must reach the sink socket."""
    marker = b"wire-check %d" % n
    s = socket.create_connection((svc.dst, svc.port), timeout=REPLY_TIMEOUT, source_address=(svc.srcs[0], 0))
    try:
        hdr = _raw_header(2**40 + n, 0, len(marker), 4000, 5000, 0, 0, bytes(4), 0, bytes(16))
        s.sendall(hdr + marker)
        deadline = time.monotonic() + REPLY_TIMEOUT
        svc.sink.settimeout(REPLY_TIMEOUT)
        while True:
            got = svc.sink.recv(RDS_MAX_MSG_SIZE)
            if got == marker:
                return
            assert time.monotonic() < deadline, f"{marker!r} not delivered"
    finally:
        s.shutdown(socket.SHUT_WR)
        _drain_until_eof(s, time.monotonic() + REPLY_TIMEOUT)
        linger_close(s)


def fuzz_wire(
    svc: WireService,
    count: int,
    seed: int = 0xBEEF,
    batch: int = 20000,
    max_seconds: float = 3600.0,
    progress: Callable[[Stats], None] | None = None,
) -> Stats:
    """``count`` wire inputs (messages with mutated fields, bad headers, garbage) over TCP connections to the
    service of :func:`wire_service`; each connection sends its stream, half-closes and waits for the service
    to close (a service that neither closes nor resets within REPLY_TIMEOUT is a hang)."""
    from pyrds import netns

    def run() -> Stats:
        rng = random.Random(seed)
        gen = WireGen(rng)
        st = Stats("wire", pid=svc.pid)
        st.rss_kb.append(rss_kb(svc.pid))
        outcomes = {"eof": 0, "reset": 0, "timeout": 0}
        start = time.monotonic()
        while st.count < count:
            goal = min(count, st.count + batch)
            while st.count < goal:
                inputs = gen.stream()
                try:
                    s = _tcp(svc, rng)
                except TimeoutError:
                    st.hangs += 1
                    st.crashes.append(f"connection {st.connections + 1} not accepted in time")
                    return st
                st.connections += 1
                st.count += len(inputs)
                how = "timeout"
                if send_stream(s, inputs, rng):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_WR)
                    how = _drain_until_eof(s, time.monotonic() + REPLY_TIMEOUT)
                outcomes[how] += 1
                linger_close(s)
                if how == "timeout":
                    st.hangs += 1
                    st.crashes.append(f"service neither closed nor reset connection {st.connections}")
                    return st
            st.batches += 1
            _deliver(svc, st.batches)
            svc.health.check()
            pids = netns.netns_pids(svc.dst_ns)
            if pids != [svc.pid]:
                st.crashes.append(f"service pid {svc.pid} -> processes {pids}")
                return st
            st.rss_kb.append(rss_kb(svc.pid))
            st.seconds = time.monotonic() - start
            if progress is not None:
                progress(st)
            if st.seconds > max_seconds:
                break
        st.seconds = time.monotonic() - start
        st.dropped = outcomes["reset"]
        st.extra.update(closed=outcomes["eof"])
        return st

    st = netns.run_in_netns(svc.src_ns, run)
    from pyrds.userspace.control import stack_counters

    counters = stack_counters(svc.sink)  # proof that the inputs reached the RDS/TCP receive path
    for name in (
        "tcp_protocol_error",
        "recv_delivered",
        "recv_drop_no_sock",
        "recv_drop_old_seq",
        "recv_ping",
        "cong_update_received",
        "tcp_accept_refused",
    ):
        st.extra[name] = int(counters.get(name, 0))
    return st


def check(st: Stats, count: int) -> None:
    """The verdict of a run: every input went out, no crash, no hang, RSS under the bound."""
    print(st.line())
    assert not st.crashes, st.crashes[:5]
    assert st.hangs == 0
    assert st.count >= count, f"only {st.count} of {count} inputs in {st.seconds:.0f} s"
    assert st.max_rss_kb < RSS_LIMIT_KB, f"service RSS {st.max_rss_kb} kB >= {RSS_LIMIT_KB} kB"
