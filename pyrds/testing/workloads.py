"""Bulk workloads run next to the sockets (inside an agent, or in-process): no per-message RPC.

:func:`exchange` is the kernel selftest's traffic pattern (tools/testing/selftests/net/rds/test.py):
every socket
sends ``count`` messages of pseudo-random size and content to every peer while receiving, non-blocking
with poll,
retrying on EAGAIN/ENOBUFS, and keeps a running SHA-256 per (sender, receiver) pair on both sides. Equal
digests
on the two sides prove exactly-once, in-order delivery (a loss, duplicate or reordering changes the digest).
:func:`mainline_selftest` is the mainline selftest's own pattern (two nodes, one socket each, sysctl resets);
:func:`socket_selftest` the same idea with several sockets a node, a pseudo-random plan, epoll and messages of
several RDS/IB fragments (the RDS/IB selftest scenario).
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import io
import itertools
import os
import random
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from pyrds.constants import SOL_RDS
from pyrds.testing.restart import expected_per_socket, resume_file

RETRY_ERRNOS = (errno.EAGAIN, errno.ENOBUFS)


def addr_key(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}"


class Watchdog:
    """Ends a transfer that outlasts ``timeout`` seconds or, with ``stall``, makes no progress for ``stall``
    seconds (a stalled transfer, told apart from a slow one on a busy machine)."""

    #: pauses in progress at least this long are recorded in :attr:`pauses`
    PAUSE_S = 1.0

    def __init__(self, timeout: float, stall: float | None) -> None:
        now = time.monotonic()
        self.timeout, self.stall = timeout, stall
        self.start, self.deadline, self.last = now, now + timeout, now
        self.mark: object = None
        #: (seconds since start when the pause began, its length, progress mark during it): where a slow
        #: transfer spent its time (a reconnect backoff, a retransmit wait) for the test's log
        self.pauses: list[tuple[float, float, object]] = []

    def why_stop(self, progress: object) -> str | None:
        """None while the transfer may go on (``progress``: anything that changes when it moves), else why
        it must end."""
        now = time.monotonic()
        if progress != self.mark:
            if now - self.last >= self.PAUSE_S and len(self.pauses) < 50:
                self.pauses.append((round(self.last - self.start, 2), round(now - self.last, 2), self.mark))
            self.mark, self.last = progress, now
        elif self.stall is not None and now - self.last > self.stall:
            return f"stalled: nothing for {self.stall:g}s"
        if now > self.deadline:
            return f"not done after {self.timeout:g}s"
        return None


def drain_ready(sock: Any, bufsize: int, flags: int = 0) -> Iterator[tuple[bytes, Any]]:
    """Every message ``sock`` has queued, as ``(data, address)``, until EAGAIN (``sock`` non-blocking, or
    ``flags`` with MSG_DONTWAIT)."""
    while True:
        try:
            got: tuple[bytes, Any] = sock.recvfrom(bufsize, flags)
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                return
            raise
        yield got


def payload_for(seed: int, src: str, dst: str, i: int, max_size: int) -> bytes:
    rng = random.Random(f"{seed}/{src}/{dst}/{i}")
    size = rng.randrange(0, max_size + 1)
    return struct.pack(">I", i) + rng.randbytes(size)


def exchange(
    socks: Sequence[Any],
    *,
    peers: Sequence[Any],
    count: int,
    seed: int = 1,
    max_size: int = 1024,
    timeout: float = 600.0,
    stall: float | None = None,
) -> dict[str, Any]:
    """Send ``count`` messages to each peer from ``socks[0]`` and receive ``count`` from each peer.

    Ends with TimeoutError after ``timeout`` seconds in all, or, with ``stall``, once nothing was sent or
    received for ``stall`` seconds (a stalled transfer, told apart from a slow one on a busy machine)."""
    sock = socks[0]
    sock.setblocking(False)
    me = addr_key(sock.getsockname())
    peer_keys = [addr_key(p) for p in peers]
    sent_hash = {k: hashlib.sha256() for k in peer_keys}
    recv_hash: dict[str, Any] = {}
    recv_n: dict[str, int] = {}
    order = [(j, i) for i in range(count) for j in range(len(peers))]
    idx = 0
    pending: bytes | None = None
    expected = count * len(peers)
    got = 0
    retries = 0
    refusals: dict[int, int] = {}  # errno -> sends refused (told on a stall: congestion or a full queue)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLOUT)
    watchdog = Watchdog(timeout, stall)
    while idx < len(order) or got < expected:
        why = watchdog.why_stop((idx, got))
        if why:
            refused = ", ".join(f"{errno.errorcode.get(e, e)} x{n}" for e, n in sorted(refusals.items()))
            raise TimeoutError(
                f"{me}: {why}: sent {idx}/{len(order)}, received {got}/{expected}"
                f"; sends refused: {refused or 'none'}"
            )
        if idx >= len(order):
            poller.modify(sock.fileno(), select.POLLIN)
        poller.poll(50)
        for data, addr in drain_ready(sock, 1 << 20):
            key = addr_key(addr)
            recv_hash.setdefault(key, hashlib.sha256()).update(data)
            recv_n[key] = recv_n.get(key, 0) + 1
            got += 1
        while idx < len(order):
            j, i = order[idx]
            if pending is None:
                pending = payload_for(seed, me, peer_keys[j], i, max_size)
            try:
                sock.sendto(pending, peers[j])
            except OSError as exc:
                if exc.errno in RETRY_ERRNOS:
                    retries += 1
                    refusals[exc.errno] = refusals.get(exc.errno, 0) + 1
                    if exc.errno == errno.ENOBUFS:
                        time.sleep(0.002)
                    break
                raise
            sent_hash[peer_keys[j]].update(pending)
            pending = None
            idx += 1
    return {
        "me": me,
        "sent": {k: h.hexdigest() for k, h in sent_hash.items()},
        "recv": {k: h.hexdigest() for k, h in recv_hash.items()},
        "recv_n": recv_n,
        "retries": retries,
        "refusals": {errno.errorcode.get(e, str(e)): n for e, n in sorted(refusals.items())},
        "elapsed_s": round(time.monotonic() - watchdog.start, 2),
        "pauses": watchdog.pauses,
    }


def drain(socks: Sequence[Any], *, count: int, timeout: float = 60.0) -> list[bytes]:
    """Receive exactly ``count`` messages on ``socks[0]`` (blocking with a deadline)."""
    sock = socks[0]
    sock.settimeout(timeout)
    return [sock.recv(1 << 20) for _ in range(count)]


def sleep(socks: Sequence[Any], *, seconds: float) -> None:
    """Do nothing for ``seconds`` (a job that keeps ``wait`` blocked, for harness tests)."""
    time.sleep(seconds)


#: the longest a :func:`stress_passive` job serves
STRESS_PASSIVE_MAX_S = 7200.0
#: stop events of the running :func:`stress_passive` jobs, by the id of the socket each serves
_STRESS_STOPS: dict[int, threading.Event] = {}


def stress_passive(socks: Sequence[Any], *, seconds: float, sockbuf: int = 4 << 20) -> int:
    """Serve ``pyrds stress`` clients on ``socks[0]`` (bound and pinned by the caller) as ``pyrds stress
    --passive`` does: its buffers raised to ``sockbuf`` bytes (the CLI's default), then
    :func:`pyrds.cli.stress_proto.serve` until :func:`stress_passive_stop` names that socket or ``seconds``
    pass; the number of client runs that finished. For a node that only an agent reaches (the benchmark's
    kernel->userspace RDS/IB row: the userspace node lives in a peer guest)."""
    from pyrds.cli.stress_proto import serve, size_buffers

    if type(seconds) not in (int, float) or not 0 < seconds <= STRESS_PASSIVE_MAX_S:
        raise ValueError(f"seconds must be in (0, {STRESS_PASSIVE_MAX_S:.0f}]")
    if type(sockbuf) is not int or not 0 <= sockbuf <= 64 << 20:
        raise ValueError("sockbuf must be an int in [0, 64 MiB]")
    sock = socks[0]
    if id(sock) in _STRESS_STOPS:
        raise ValueError("that socket is served already")
    if sockbuf:
        size_buffers(sock, sockbuf)
    stop = _STRESS_STOPS[id(sock)] = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    reports = io.StringIO()
    try:
        serve(sock, False, True, out=reports, stop=stop)
    finally:
        timer.cancel()
        _STRESS_STOPS.pop(id(sock), None)
    return len(reports.getvalue().splitlines())


def stress_passive_stop(socks: Sequence[Any]) -> bool:
    """End the :func:`stress_passive` job serving ``socks[0]`` (within its 0.2 s poll); False if none does."""
    stop = _STRESS_STOPS.get(id(socks[0]))
    if stop is not None:
        stop.set()
    return stop is not None


def userspace_force_reconnect(socks: Sequence[Any]) -> None:
    """The userspace stack's equivalent of writing net.rds.tcp.rds_tcp_sndbuf: drop all TCP paths."""
    for modname, fn in (
        ("pyrds.userspace.control", "force_reconnect"),
        ("pyrds.userspace.sysctl", "force_reconnect"),
        ("pyrds.userspace", "force_reconnect"),
    ):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        if hasattr(mod, fn):
            getattr(mod, fn)()
            return
    raise NotImplementedError("the userspace stack exposes no force_reconnect knob")


def userspace_sysctl_set(socks: Sequence[Any], *, name: str, value: int) -> None:
    """Set one of the userspace stack's sysctl-like settings (``pyrds.userspace.control.sysctl_set``)."""
    from pyrds.userspace import control

    control.sysctl_set(name, value)


def rdma_probe(socks: Sequence[Any], *, dest: Any, kind: str) -> int:
    """Try an RDMA or atomic send with buffers that exist in THIS process; return 0 or the errno."""
    import ctypes

    from pyrds import cmsg, uapi
    from pyrds.constants import CmsgType

    sock = socks[0]
    local = ctypes.create_string_buffer(4096)
    iov = uapi.rds_iovec()
    iov.addr = ctypes.addressof(local)
    iov.bytes = 64
    if kind == "rdma":
        anc = [
            cmsg.rdma_args(
                cookie=0x100000001,
                remote_addr=0,
                remote_bytes=64,
                local_vec_addr=ctypes.addressof(iov),
                nr_local=1,
                user_token=7,
            )
        ]
    else:
        addr = (ctypes.addressof(local) + 7) & ~7
        anc = [
            cmsg.build(
                cmsg.AtomicArgs(
                    kind=CmsgType.RDS_CMSG_ATOMIC_FADD,
                    cookie=0x100000001,
                    local_addr=addr,
                    remote_addr=0,
                    add=1,
                )
            )
        ]
    try:
        sock.sendmsg([b"rdma"], anc, 0, dest)
    except OSError as exc:
        return exc.errno or -1
    finally:
        del local, iov
    return 0


#: a restart scenario's message: (generation, sending socket's index, its message number), then padding
RESTART_MSG = struct.Struct("!III")
RESTART_PAD = bytes(52)  # 64-byte messages


def stack_service_pid(socks: Sequence[Any]) -> int:
    """The pid of the userspace stack service that serves ``socks[0]`` (SO_PEERCRED of its control
    connection); ValueError for a socket of another backend."""
    ctl = getattr(socks[0], "_ctl", None)
    if ctl is None:
        raise ValueError("not a userspace socket with a live control connection")
    cred = ctl.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[:4], sys.byteorder)


def restart_send(
    socks: Sequence[Any],
    *,
    dest: Sequence[Any],
    count: int,
    gen: int,
    start: Sequence[int] = (),
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Send ``count`` messages round-robin from ``socks`` to ``dest``; message j of socket i carries (``gen``,
    i, j), j counting on from ``start[i]`` (0 without it: a later batch of the same sockets goes on where
    the last one stopped). Each socket has a timeout, so a congested destination refuses with ENOBUFS at
    once (rds_sendmsg is non-blocking on a socket with a timeout, as the stdlib makes it): such a send is
    tried again 10 ms later. Ends at the first other error or after ``timeout`` seconds in all: per socket
    the number of sends that returned success, the errno (or "timeout") that ended it (None when all were
    sent), and how many sends congestion refused."""
    target = tuple(dest)
    first = list(start) if start else [0] * len(socks)
    sent = [0] * len(socks)
    error: int | str | None = None
    refused = 0
    deadline = time.monotonic() + timeout
    for s in socks:
        s.settimeout(timeout)
    try:
        for j in range(count):
            i = j % len(socks)
            msg = RESTART_MSG.pack(gen, i, first[i] + sent[i]) + RESTART_PAD
            while True:
                try:
                    socks[i].sendto(msg, target)
                    break
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS or time.monotonic() > deadline:
                        raise
                    refused += 1
                    time.sleep(0.01)
            sent[i] += 1
    except TimeoutError:
        error = "timeout"
    except OSError as exc:
        error = exc.errno if exc.errno is not None else str(exc)
    return {"sent": sent, "error": error, "refused": refused}


def _write_progress(progress: str, n: int) -> None:
    with open(progress + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(progress + ".tmp", progress)


def restart_recv(
    socks: Sequence[Any],
    *,
    nsock: int,
    count: int,
    gen: int,
    idle: float,
    progress: str,
    pause_at: int = 0,
) -> dict[str, Any]:
    """Receive on ``socks[0]`` until the last message of each of the ``nsock`` sockets of a ``gen`` sender of
    ``count`` messages (:func:`restart_send`) arrived, ``idle`` seconds passed without a message ("idle"), or
    an error (its stack service died: the errno). Every message as (gen, socket, number) in arrival order;
    the number received so far is written to the file ``progress`` every 50 messages. ``pause_at``: after
    that many messages (a multiple of 50), stop reading until :func:`pyrds.testing.restart.resume_reader`
    lets it read on (at most ``idle`` seconds, then "paused"), so that the transfer cannot end before the
    test kills the service: the senders run into the receiver's full queue and wait."""
    sock = socks[0]
    sock.settimeout(idle)
    last = {i: n - 1 for i in range(nsock) if (n := expected_per_socket(count, nsock, i))}
    got: list[tuple[int, int, int]] = []
    error: int | str | None = None
    try:
        while last:
            try:
                data = sock.recv(4096)
            except TimeoutError:
                error = "idle"
                break
            g, i, j = RESTART_MSG.unpack_from(data)
            got.append((g, i, j))
            if g == gen and last.get(i) == j:
                del last[i]
            if len(got) % 50 == 0:
                _write_progress(progress, len(got))
                if len(got) == pause_at:
                    deadline = time.monotonic() + idle
                    resume = resume_file(progress)
                    while not resume.exists():
                        if time.monotonic() > deadline:
                            return {"got": got, "error": "paused"}
                        time.sleep(0.02)
    except OSError as exc:
        error = exc.errno if exc.errno is not None else str(exc)
    return {"got": got, "error": error}


MAINLINE_RESET_ERRNOS = (errno.EAGAIN, errno.ENOBUFS, errno.ECONNRESET, errno.EPIPE)
RDS_INFO_FIRST, RDS_INFO_LAST = 10000, 10017


def _ranges(numbers: Iterable[int], limit: int = 12) -> str:
    """``1-5,9,12-14`` for sorted runs of ``numbers`` (at most ``limit`` runs, then how many more)."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs[:limit])
    return text + (f",... ({len(runs) - limit} more runs)" if len(runs) > limit else "")


def mainline_plan(count: int) -> list[tuple[int, int]]:
    """(sender, receiver) node index of message n in the mainline selftest's pattern: senders alternate
    0, 1; the receiver follows n % 3, so a node also sends to itself (1->1, 0->0, 1->1 in each 6)."""
    return [(n % 2, 1 - (n % 3) % 2) for n in range(count)]


def mainline_payload(n: int) -> bytes:
    return hashlib.sha256(f"packet {n}".encode()).hexdigest().encode()


def _rewrite_buffer_sysctls(backend: str) -> None:
    """What the mainline selftest does after every send burst: rewrite net.rds.tcp.rds_tcp_{rcv,snd}buf,
    which drops every RDS/TCP connection of the namespace (rds_tcp_sysctl_reset); the userspace stack's
    equivalent knob on a userspace node."""
    if backend == "kernel":
        for name in ("rds_tcp_rcvbuf", "rds_tcp_sndbuf"):
            with open(f"/proc/sys/net/rds/tcp/{name}", "w") as fh:
                fh.write("10000\n")
    else:
        userspace_force_reconnect([])


def mainline_selftest(
    socks: Sequence[Any],
    *,
    me: int,
    addrs: Sequence[Any],
    count: int,
    backend: str,
    stall: float = 45.0,
    timeout: float = 1800.0,
    max_burst: int = 200,
) -> dict[str, Any]:
    """Node ``me``'s half of the mainline RDS selftest (tools/testing/selftests/net/rds/test.py, TCP part),
    written from its description.

    Message n goes from node ``n % 2`` to node ``1 - (n % 3) % 2`` (``addrs``: both nodes' bound addresses).
    Non-blocking sends in bursts until the socket pushes back (or ``max_burst`` messages, so the count and
    not the buffer size decides how often connections drop), then every message that is there is received
    (poll), then the RDS/TCP buffer sysctls are rewritten (every connection of the namespace drops). A
    running SHA-256 of ``<payload>`` per (sender, receiver). Finally every RDS_INFO option 10000..10017 is
    read with a 1024-byte buffer. Ends on a stall (``stall`` s with nothing sent or received) or
    ``timeout``."""
    sock = socks[0]
    sock.setblocking(False)
    plan = mainline_plan(count)
    mine = [n for n, (s, _) in enumerate(plan) if s == me]
    expect = {s: sum(1 for (s2, r) in plan if s2 == s and r == me) for s in (0, 1)}
    key_of = {addr_key(a): i for i, a in enumerate(addrs)}
    sent_hash = {r: hashlib.sha256() for r in (0, 1)}
    recv_hash = {s: hashlib.sha256() for s in (0, 1)}
    recv_n = {0: 0, 1: 0}
    # which messages arrived from each sender: a stall then says which are missing (one burst's block, the
    # tail, scattered ones), not only how many
    number_of = {mainline_payload(n): n for n, (_s, r) in enumerate(plan) if r == me}
    arrived: dict[int, set[int]] = {0: set(), 1: set()}
    strangers = 0
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    idx = resets = 0
    watchdog = Watchdog(timeout, stall)
    while idx < len(mine) or any(recv_n[s] < expect[s] for s in (0, 1)):
        why = watchdog.why_stop((idx, sum(recv_n.values())))
        if why:
            # by ordinal: the k-th message that sender addressed to this node (a lost burst is one run)
            missing = {
                src: _ranges(
                    k
                    for k, n in enumerate(n for n, (s, r) in enumerate(plan) if s == src and r == me)
                    if n not in arrived[src]
                )
                for src in (0, 1)
                if recv_n[src] < expect[src]
            }
            raise TimeoutError(
                f"node {me}: {why}: sent {idx}/{len(mine)}, received {recv_n} of {expect}, "
                f"{resets} sysctl rewrites; missing (k-th message from that sender) by sender: {missing}"
            )
        burst = 0
        while idx < len(mine) and burst < max_burst:
            n = mine[idx]
            data = mainline_payload(n)
            dest = plan[n][1]
            try:
                sock.sendto(data, addrs[dest])
            except OSError as exc:
                if exc.errno in MAINLINE_RESET_ERRNOS:
                    break
                raise
            sent_hash[dest].update(b"<" + data + b">")
            idx += 1
            burst += 1
        poller.poll(50)
        for data, addr in drain_ready(sock, 1024):
            src = key_of.get(addr_key(addr))
            if src is None:
                strangers += 1
                continue
            recv_hash[src].update(b"<" + data + b">")
            recv_n[src] += 1
            n_got = number_of.get(data)
            if n_got is not None:
                arrived[src].add(n_got)
        if burst:
            _rewrite_buffer_sysctls(backend)
            resets += 1
    info: dict[int, int] = {}
    for opt in range(RDS_INFO_FIRST, RDS_INFO_LAST + 1):
        try:
            sock.getsockopt(SOL_RDS, opt, 1024)
            info[opt] = 0
        except OSError as exc:
            info[opt] = exc.errno or -1
    return {
        "sent": {r: h.hexdigest() for r, h in sent_hash.items()},
        "recv": {s: h.hexdigest() for s, h in recv_hash.items()},
        "recv_n": recv_n,
        "expect": expect,
        "strangers": strangers,
        "resets": resets,
        "info": info,
    }


# ------------------------------------------------------------------------------------------ socket selftest
# The kernel selftest's idea (a pseudo-random sender/receiver pattern, non-blocking sockets and epoll, a
# SHA-256 per (sender, receiver) pair) with several sockets on each of two nodes and messages of varied
# sizes, up to several RDS/IB fragments (tests/conformance/test_ib_selftest.py). The plan and the bookkeeping
# are pure (tests/unit/test_workloads.py); :func:`socket_selftest` is one node's socket loop, in its agent.

#: (weight, smallest, largest) payload sizes, header included: small messages, one RDS/IB fragment's worth,
#: sizes around the 4096-byte fragment boundary, and messages of two to four fragments
SELFTEST_SIZES = ((45, 8, 256), (20, 257, 4095), (15, 4094, 4098), (20, 4099, 16384))
SELFTEST_MAX = max(hi for _w, _lo, hi in SELFTEST_SIZES)
#: every payload starts with its message number and its ordinal within its (sender, receiver) pair
SELFTEST_HEADER = struct.Struct(">II")
#: what the receiver check lists by itself (later problems are only counted)
SELFTEST_MAX_PROBLEMS = 10


class Planned(NamedTuple):
    """One message of the socket selftest: sender and receiver socket (numbered node by node), size (header
    included), and its ordinal among the messages of that (sender, receiver) pair."""

    sender: int
    receiver: int
    size: int
    ordinal: int


def socket_names(per_node: Sequence[int]) -> list[str]:
    """``A0``, ``A1``, ``B0``, ...: socket i of node n (n-th letter), in the plan's numbering."""
    return [f"{chr(ord('A') + node)}{j}" for node, k in enumerate(per_node) for j in range(k)]


def pair_name(names: Sequence[str], sender: int, receiver: int) -> str:
    return f"{names[sender]}->{names[receiver]}"


def selftest_plan(count: int, per_node: Sequence[int], seed: int) -> list[Planned]:
    """The ``count`` messages of the socket selftest, the same on every node for the same arguments: the
    sender is any socket (``per_node[n]`` sockets on node n, numbered node by node), the receiver any socket
    of another node, the size drawn from :data:`SELFTEST_SIZES`, all from a PRNG seeded with ``seed``."""
    if len(per_node) < 2 or min(per_node) < 1:
        raise ValueError(f"two or more nodes of one or more sockets each, not {list(per_node)}")
    rng = random.Random(f"socket-selftest/{seed}")
    owner = [node for node, k in enumerate(per_node) for _ in range(k)]
    others = {node: [i for i, o in enumerate(owner) if o != node] for node in set(owner)}
    weights = [w for w, _lo, _hi in SELFTEST_SIZES]
    ordinals: dict[tuple[int, int], int] = {}
    plan = []
    for _ in range(count):
        s = rng.randrange(len(owner))
        r = rng.choice(others[owner[s]])
        _w, lo, hi = rng.choices(SELFTEST_SIZES, weights)[0]
        k = ordinals.get((s, r), 0)
        ordinals[(s, r)] = k + 1
        plan.append(Planned(s, r, rng.randint(lo, hi), k))
    return plan


def plan_counts(plan: Sequence[Planned], names: Sequence[str]) -> dict[str, int]:
    """How many messages each (sender, receiver) pair of the plan carries, by :func:`pair_name`."""
    counts: dict[str, int] = {}
    for m in plan:
        key = pair_name(names, m.sender, m.receiver)
        counts[key] = counts.get(key, 0) + 1
    return counts


def selftest_pool(seed: int) -> bytes:
    """The bytes payloads are cut from (twice the largest payload, from ``seed``)."""
    return random.Random(f"socket-selftest-pool/{seed}").randbytes(2 * SELFTEST_MAX)


def selftest_payload(pool: bytes, n: int, m: Planned) -> bytes:
    """Message ``n`` of the plan: its number and ordinal, then ``m.size - 8`` bytes of ``pool`` from an
    offset that depends on ``n``."""
    body = m.size - SELFTEST_HEADER.size
    offset = (n * 40503) % (len(pool) - body + 1)
    return SELFTEST_HEADER.pack(n, m.ordinal) + pool[offset : offset + body]


class PairLedger:
    """A running SHA-256 and a count of the messages of each (sender, receiver) pair, as one side saw them:
    the sender's and the receiver's ledgers agree on a pair exactly when every message of it arrived once, in
    order, unchanged."""

    EMPTY = hashlib.sha256().hexdigest()

    def __init__(self) -> None:
        self._hashes: dict[str, Any] = {}
        self.counts: dict[str, int] = {}

    def add(self, key: str, data: bytes) -> None:
        h = self._hashes.get(key)
        if h is None:
            h = self._hashes[key] = hashlib.sha256()
        h.update(len(data).to_bytes(4, "big"))  # message boundaries count: a split or a join shows
        h.update(data)
        self.counts[key] = self.counts.get(key, 0) + 1

    def summary(self) -> dict[str, tuple[int, str]]:
        """``{pair: (messages, SHA-256 hex)}`` (picklable, for an agent job's result)."""
        return {k: (self.counts[k], h.hexdigest()) for k, h in sorted(self._hashes.items())}


def ledger_mismatches(
    expected: Mapping[str, int],
    sent: Mapping[str, tuple[int, str]],
    received: Mapping[str, tuple[int, str]],
) -> list[str]:
    """Every pair whose sender did not send the plan's count, or whose receiver did not get exactly what its
    sender sent (count, then digest), in words; empty when every pair is exact. ``sent`` / ``received``: the
    :meth:`PairLedger.summary` of every sending / receiving node, merged."""
    problems = []
    for key in sorted(set(expected) | set(sent) | set(received)):
        want = expected.get(key, 0)
        n_sent, d_sent = sent.get(key, (0, PairLedger.EMPTY))
        n_recv, d_recv = received.get(key, (0, PairLedger.EMPTY))
        if n_sent != want:
            problems.append(f"{key}: sent {n_sent} of {want}")
        elif n_recv != want:
            problems.append(f"{key}: received {n_recv} of {want}")
        elif d_recv != d_sent:
            problems.append(
                f"{key}: {want} messages, but the receiver's SHA-256 {d_recv[:12]} is not the sender's "
                f"{d_sent[:12]}: lost, duplicated, reordered or changed"
            )
    return problems


class SelftestReceiver:
    """One node's receiving side of the socket selftest: the ledger of what arrived, and each message
    checked against the plan as it arrives (per pair the plan's messages in order), so a loss, duplicate,
    reordering or changed byte is named at the first message it touches; :func:`ledger_mismatches` is the
    verdict."""

    def __init__(self, plan: Sequence[Planned], receivers: Iterable[int], names: Sequence[str], pool: bytes):
        self.plan, self.names, self.pool = plan, names, pool
        mine = set(receivers)
        #: per (sender, receiver): the plan's message numbers, in order
        self.due: dict[tuple[int, int], list[int]] = {}
        for n, m in enumerate(plan):
            if m.receiver in mine:
                self.due.setdefault((m.sender, m.receiver), []).append(n)
        self.expected = sum(len(ns) for ns in self.due.values())
        self.ledger = PairLedger()
        self.got_n: dict[tuple[int, int], int] = {}
        self.total = 0
        self.bad = 0
        self.problems: list[str] = []

    def got(self, sender: int, receiver: int, data: bytes) -> None:
        pair = (sender, receiver)
        key = pair_name(self.names, sender, receiver)
        pos = self.got_n.get(pair, 0)
        self.got_n[pair] = pos + 1
        self.total += 1
        self.ledger.add(key, data)
        due = self.due.get(pair, [])
        why = None
        if pos >= len(due):
            why = f"message {pos + 1} arrived, the plan has {len(due)}"
        else:
            n = due[pos]
            want = selftest_payload(self.pool, n, self.plan[n])
            if data != want:
                why = f"message {pos + 1} (n={n}, {len(want)} bytes) due, got {self._describe(data, want)}"
        if why is not None:
            self.bad += 1
            if len(self.problems) < SELFTEST_MAX_PROBLEMS:
                self.problems.append(f"{key}: {why}")

    @staticmethod
    def _describe(data: bytes, want: bytes) -> str:
        if len(data) >= SELFTEST_HEADER.size and data[: SELFTEST_HEADER.size] != want[: SELFTEST_HEADER.size]:
            n, k = SELFTEST_HEADER.unpack_from(data)
            return f"n={n} (its message {k + 1}), {len(data)} bytes"
        if len(data) != len(want):
            return f"{len(data)} bytes"
        first = next(i for i, (x, y) in enumerate(zip(data, want, strict=True)) if x != y)
        return f"its bytes, changed from offset {first}"

    @property
    def done(self) -> bool:
        """Every pair has at least its planned count (a duplicate may make that early: the ledgers tell)."""
        return all(self.got_n.get(pair, 0) >= len(ns) for pair, ns in self.due.items())

    def missing(self) -> dict[str, str]:
        """Pairs still short of their count: how many arrived, and the next message due."""
        out = {}
        for pair, ns in sorted(self.due.items()):
            k = self.got_n.get(pair, 0)
            if k < len(ns):
                out[pair_name(self.names, *pair)] = f"{k} of {len(ns)}, next n={ns[k]}"
        return out


def socket_selftest(
    socks: Sequence[Any],
    *,
    me: int,
    addrs: Sequence[Sequence[Any]],
    count: int,
    seed: int = 1,
    stall: float = 60.0,
    timeout: float = 600.0,
    max_burst: int = 32,
) -> dict[str, Any]:
    """Node ``me``'s half of the socket selftest (:func:`selftest_plan`): ``addrs[n]`` are node n's bound
    sockets' addresses, ``socks`` this node's sockets in that order. Every socket non-blocking; this node
    sends the plan's messages whose sender is one of its sockets, in plan order, in bursts of at most
    ``max_burst`` (a send refused with EAGAIN/ENOBUFS is retried after reading), and reads the sockets epoll
    says are readable, at most ``max_burst`` messages each per round; a :class:`PairLedger` of what it
    sent, a :class:`SelftestReceiver` of what it got. Ends with TimeoutError on a stall (nothing sent or
    received for ``stall`` s) or after ``timeout`` s, naming the pairs still short and what refused the
    sends."""
    per_node = [len(a) for a in addrs]
    if len(socks) != per_node[me]:
        raise ValueError(f"node {me} has {per_node[me]} addresses but {len(socks)} sockets")
    names = socket_names(per_node)
    plan = selftest_plan(count, per_node, seed)
    pool = selftest_pool(seed)
    flat = [a for node in addrs for a in node]
    first = sum(per_node[:me])
    index_of = {addr_key(a): i for i, a in enumerate(flat)}
    to_send = [n for n, m in enumerate(plan) if first <= m.sender < first + len(socks)]
    sent = PairLedger()
    receiver = SelftestReceiver(plan, range(first, first + len(socks)), names, pool)
    refusals: dict[int, int] = {}
    strangers = idx = 0
    ep = select.epoll()
    by_fd: dict[int, int] = {}
    for j, sock in enumerate(socks):
        sock.setblocking(False)
        by_fd[sock.fileno()] = first + j
        ep.register(sock.fileno(), select.EPOLLIN)
    watchdog = Watchdog(timeout, stall)
    try:
        while idx < len(to_send) or not receiver.done:
            why = watchdog.why_stop((idx, receiver.total))
            if why:
                # messages queued that epoll did not report (a readiness bug, not a transport one)
                unsignalled = {names[first + j]: len(list(drain_ready(s, 1))) for j, s in enumerate(socks)}
                refused = ", ".join(f"{errno.errorcode.get(e, e)} x{n}" for e, n in sorted(refusals.items()))
                raise TimeoutError(
                    f"node {names[first][0]}: {why}: sent {idx} of {len(to_send)}, received "
                    f"{receiver.total} of {receiver.expected}; short: {receiver.missing()}; sends refused: "
                    f"{refused or 'none'}; queued but not reported by epoll: {unsignalled}; "
                    f"checks: {receiver.problems or 'no problem'}"
                )
            refused_now = False
            burst = 0
            while idx < len(to_send) and burst < max_burst:
                n = to_send[idx]
                m = plan[n]
                data = selftest_payload(pool, n, m)
                try:
                    socks[m.sender - first].sendto(data, flat[m.receiver])
                except OSError as exc:
                    if exc.errno in RETRY_ERRNOS:
                        refusals[exc.errno] = refusals.get(exc.errno, 0) + 1
                        refused_now = True
                        break
                    raise
                sent.add(pair_name(names, m.sender, m.receiver), data)
                idx += 1
                burst += 1
            # wait for input only when there is nothing to send right now (all sent, or refused: briefly)
            wait = 0.005 if refused_now else 0.05 if idx >= len(to_send) else 0.0
            for fd, _events in ep.poll(wait):
                r = by_fd[fd]
                # at most max_burst a socket per round (epoll is level-triggered: the rest comes next round),
                # so sends go on and progress is sampled while a fast peer keeps the queue full
                ready = drain_ready(socks[r - first], SELFTEST_MAX + 1)
                for data, addr in itertools.islice(ready, max_burst):
                    s = index_of.get(addr_key(addr))
                    if s is None:
                        strangers += 1
                    else:
                        receiver.got(s, r, data)
    finally:
        ep.close()
    return {
        "node": names[first][0],
        "sent": sent.summary(),
        "recv": receiver.ledger.summary(),
        "recv_total": receiver.total,
        "expected": receiver.expected,
        "bad": receiver.bad,
        "problems": receiver.problems,
        "strangers": strangers,
        "refusals": {errno.errorcode.get(e, str(e)): n for e, n in sorted(refusals.items())},
        "elapsed_s": round(time.monotonic() - watchdog.start, 2),
        "pauses": watchdog.pauses,
    }
