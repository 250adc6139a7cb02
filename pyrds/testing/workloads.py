"""Bulk workloads run next to the sockets (inside an agent, or in-process): no per-message RPC.

:func:`exchange` is the kernel selftest's traffic pattern (tools/testing/selftests/net/rds/test.py):
every socket
sends ``count`` messages of pseudo-random size and content to every peer while receiving, non-blocking
with poll,
retrying on EAGAIN/ENOBUFS, and keeps a running SHA-256 per (sender, receiver) pair on both sides. Equal
digests
on the two sides prove exactly-once, in-order delivery (a loss, duplicate or reordering changes the digest).
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import random
import select
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pyrds.constants import SOL_RDS

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
        while True:
            try:
                data, addr = sock.recvfrom(1 << 20)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                raise
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
        while True:
            try:
                data, addr = sock.recvfrom(1024)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                raise
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
