"""What a userspace stack's process structure costs before any RDS work (issue 10, docs/userspace-profile.md).

pyrds's userspace stack is one service per network namespace, shared by that namespace's processes and
trusted like the kernel: every message goes client -> service -> TCP -> service -> client, two process hops
per direction that the kernel does inside the sender's and the receiver's system calls. This measures, in one
guest boot, request/response between two namespaces joined by a veth pair, each loop the least Python can do
(blocking calls, no poll, no checks):

- ``kernel``: AF_RDS over the kernel's RDS/TCP, stdlib ``socket.socket`` (the issue's baseline);
- ``relay``: the same loop over an AF_UNIX SOCK_SEQPACKET to a minimal relay process per namespace, the relays
  joined by one TCP connection (a 4-byte length per message, TCP_NODELAY): the process structure of the
  userspace stack with none of its work (no RDS header, sequence, ack, accounting, readiness fd);
- ``relay-c``: the same relay compiled from benchmarks/relay.c (same wire, same flow control), when a C
  compiler is there: the structure with compiled middle processes, what a service written in C starts from;
- ``relay-c-stack`` (only when asked for, ``--kinds``): relay.c in its ``stack`` mode, which adds the
  system calls the userspace stack's service makes per message besides the relay's (a readiness byte over
  loopback TCP after every delivery, and a non-blocking read of that fd by the client end after every
  message, as pyrds's client empties its readiness fd; a SIOCOUTQ with every TCP write; a 48-byte frame
  header with a checked sequence number): what a compiled service that keeps today's system calls would
  reach;
- ``userspace``: the same loop on ``pyrds.socket("userspace")``.

``relay / kernel`` is the ceiling of any stack built this way in Python on this machine (``relay-c /
kernel`` with the two middle processes compiled); ``userspace / relay`` is how much of it pyrds keeps. Guest
only (root, AF_RDS, rds_tcp):
``python benchmarks/floor.py [--size 1024] [-T 4] [--repeat 3]``; the last line is ``PYRDS-FLOOR-JSON``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# the clone's pyrds for the loops this script runs of itself, when no pyrds is installed or on PYTHONPATH
# (appended: a tree named by PYTHONPATH, or an installed one, still comes first)
sys.path.append(str(HERE.parent))

from report import best_rates  # noqa: E402
from topology import USERSPACE_PORT, Node, make_pair, teardown  # noqa: E402

AF_RDS = 21
RDS_PORT = 4000
RELAY_TCP_PORT = 17000
MAX_MSG = 1 << 20  # RDS_MAX_MSG_SIZE
_LEN = struct.Struct("!I")


def _unix_name(tag: str) -> str:
    return "\0pyrds-floor-" + tag  # abstract: one per network namespace


# -- the loops (each its own process, in its namespace)
def _requester(send: Any, recv: Any, size: int, seconds: float) -> float:
    data = b"x" * size
    n = 0
    end = time.monotonic() + seconds
    start = time.monotonic()
    while True:
        send(data)
        recv()
        n += 1
        if n & 63 == 0 and time.monotonic() >= end:
            break
    return n / (time.monotonic() - start)


def _responder(recvfrom: Any, sendto: Any) -> None:
    print("ready", flush=True)
    while True:
        _data, src = recvfrom(1 << 17)
        sendto(b"", src)


def _sender(send: Any, size: int) -> None:
    data = b"x" * size
    print("ready", flush=True)
    while True:
        send(data)


def _receiver(recv: Any, seconds: float) -> float:
    """Messages per second from the first message on, for ``seconds``."""
    print("ready", flush=True)
    recv(1 << 17)
    n = 0
    start = time.monotonic()
    end = start + seconds
    while True:
        recv(1 << 17)
        n += 1
        if n & 63 == 0 and time.monotonic() >= end:
            break
    return n / (time.monotonic() - start)


def _rds_socket(kind: str, addr: str) -> Any:
    if kind == "kernel":
        s = socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    else:
        import pyrds

        s = pyrds.socket("userspace")
    s.bind((addr, RDS_PORT))
    return s


def relay_c_binary() -> str | None:
    """benchmarks/relay.c compiled (``cc -O2``) into a private temporary directory made for this process
    (mode 0700: nothing another local user placed in /tmp is ever run), once per process, removed at exit;
    None, with a line on stderr, when no C compiler is there or it fails (the ``relay-c`` rows are then
    missing, never made up)."""
    global _relay_c
    if _relay_c is not None:
        return _relay_c
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("[floor] relay-c: no C compiler (cc); its rows are not measured", file=sys.stderr, flush=True)
        return None
    work = tempfile.mkdtemp(prefix="pyrds-floor-relay-")
    atexit.register(shutil.rmtree, work, True)
    out = os.path.join(work, "relay")
    res = subprocess.run([cc, "-O2", "-o", out, str(HERE / "relay.c")], capture_output=True, text=True)
    if res.returncode:
        print(f"[floor] relay-c: {cc} failed: {res.stderr.strip()}", file=sys.stderr, flush=True)
        return None
    _relay_c = out
    return out


_relay_c: str | None = None


def _relay_client(tag: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(_unix_name(tag))
    return s


def _readiness_fd(relay: socket.socket) -> socket.socket:
    """relay.c's stack mode: the readiness fd it hands over as the first packet's descriptor."""
    _data, fds, _flags, _addr = socket.recv_fds(relay, 1, 1)
    if len(fds) != 1:
        raise RuntimeError("relay-c-stack: no readiness fd in the first packet")
    return socket.socket(fileno=fds[0])


def _emptying(recv: Any, ready: socket.socket) -> Any:
    """``recv`` that then empties ``ready`` with one non-blocking read, as pyrds's client empties its
    readiness fd after a read (a byte not there yet is taken by the next read)."""

    def recv_and_empty(n: int) -> bytes:
        data: bytes = recv(n)
        try:
            ready.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        return data

    return recv_and_empty


def cmd_end(kind: str, role: str, addr: str, peer: str, size: int, seconds: float) -> None:
    """One end of one cell: ``kind`` kernel, userspace (an RDS socket bound at ``addr``) or relay (the
    relay client of namespace tag ``addr``); ``role`` req, resp, send or recv."""
    if kind in ("relay", "relay-stack"):
        r = _relay_client(addr)
        send, recv = r.send, r.recv
        if kind == "relay-stack":
            recv = _emptying(recv, _readiness_fd(r))
        recvfrom, sendto = (lambda n: (recv(n), None)), (lambda d, _a: r.send(d))
    else:
        s = _rds_socket(kind, addr)
        dest = (peer, RDS_PORT)
        send, recv, recvfrom, sendto = (lambda d: s.sendto(d, dest)), s.recv, s.recvfrom, s.sendto
    try:
        if role == "resp":
            _responder(recvfrom, sendto)
        elif role == "send":
            _sender(send, size)
        elif role == "req":
            print(json.dumps({"rate": _requester(send, lambda: recv(1 << 17), size, seconds)}), flush=True)
        else:
            print(json.dumps({"rate": _receiver(recv, seconds)}), flush=True)
    except OSError:
        pass  # the other end was stopped


def cmd_relay(tag: str, listen: bool, peer: str, port: int | None = None) -> None:
    """One client (AF_UNIX SOCK_SEQPACKET) <-> one TCP connection to the other namespace's relay on ``port``
    (default :data:`RELAY_TCP_PORT`), with flow control both ways (a full TCP send buffer stops reading the
    client; a client that does not read stops reading TCP). benchmarks/relay.c takes the same arguments."""
    if port is None:
        port = RELAY_TCP_PORT
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lst.bind(_unix_name(tag))
    lst.listen(1)
    if listen:
        tl = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tl.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tl.bind(("0.0.0.0", port))
        tl.listen(1)
        print("ready", flush=True)
        tcp, _ = tl.accept()
    else:
        deadline = time.monotonic() + 10
        while True:  # the listening relay may still be starting
            try:
                tcp = socket.create_connection((peer, port))
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        print("ready", flush=True)
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client, _ = lst.accept()
    tcp.setblocking(False)
    client.setblocking(False)
    sel = selectors.DefaultSelector()
    R = selectors.EVENT_READ
    masks: dict[socket.socket, int] = {client: 0, tcp: 0}

    def interest(sock: socket.socket, mask: int) -> None:
        old = masks[sock]
        if mask == old:
            return  # an epoll_ctl only when the interest changes
        if not old:
            sel.register(sock, mask)
        elif not mask:
            sel.unregister(sock)
        else:
            sel.modify(sock, mask)
        masks[sock] = mask

    interest(client, R)
    interest(tcp, R)
    try:
        _relay_loop(sel, client, tcp, interest)
    except (ConnectionError, OSError):
        pass  # the other relay or the client went away: the cell is over
    finally:
        sel.close()
        client.close()
        tcp.close()


def _relay_loop(sel: Any, client: socket.socket, tcp: socket.socket, interest: Any) -> None:
    R, W = selectors.EVENT_READ, selectors.EVENT_WRITE
    out = bytearray()  # framed, for TCP
    pending = bytearray()  # from TCP, not yet a whole frame
    backlog: list[bytes] = []  # whole messages the client has no room for yet
    inbuf = bytearray(MAX_MSG + 1)  # one client message (SOCK_SEQPACKET: never more than RDS carries)
    inview = memoryview(inbuf)
    tcpbuf = bytearray(1 << 18)  # preallocated: a fresh 256 KiB bytes per read would be an mmap each
    tcpview = memoryview(tcpbuf)
    while True:
        for key, ev in sel.select():
            if key.fileobj is client:
                if ev & R:
                    for _ in range(64):
                        try:
                            n = client.recv_into(inbuf)
                        except BlockingIOError:
                            break
                        out += _LEN.pack(n)
                        out += inview[:n]
                        if len(out) >= 1 << 20:
                            break
                if ev & W:
                    _deliver(client, backlog)
            else:
                if ev & W and out:
                    try:
                        del out[: tcp.send(out)]
                    except BlockingIOError:
                        pass
                if ev & R:
                    got = tcp.recv_into(tcpbuf)
                    if not got:
                        return
                    pending += tcpview[:got]
                    while len(pending) >= 4:
                        (n,) = _LEN.unpack_from(pending)
                        if len(pending) < 4 + n:
                            break
                        backlog.append(bytes(pending[4 : 4 + n]))
                        del pending[: 4 + n]
                    _deliver(client, backlog)
        if out:
            try:
                del out[: tcp.send(out)]
            except BlockingIOError:
                pass
        interest(client, (R if len(out) < 1 << 20 else 0) | (W if backlog else 0))
        interest(tcp, (0 if backlog else R) | (W if out else 0))


def _deliver(client: socket.socket, backlog: list[bytes]) -> None:
    """Whole messages to the client while it has room; the rest stay in ``backlog``."""
    while backlog:
        try:
            client.send(backlog[0])
        except BlockingIOError:
            return
        del backlog[0]


# -- the driver
KINDS = ("kernel", "relay", "relay-c", "userspace")
#: every kind ``--kinds`` takes; the last only when asked for
ALL_KINDS = (*KINDS, "relay-c-stack")
COMPILED = {"relay-c", "relay-c-stack"}
#: (mode, message size): issue 10's two userspace targets
CELLS = (("rr", 1024), ("oneway", 65536))


def _spawn(node: Node, *args: str, binary: str | None = None) -> Any:
    """This script with ``args`` in ``node`` (or ``binary`` with them: the compiled relay)."""
    cmd = [binary] if binary else [sys.executable, str(Path(__file__).resolve())]
    return node.popen([*cmd, *args], stdout=subprocess.PIPE, text=True)


def _ready(p: Any) -> None:
    line = p.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"a floor process did not start: {line!r}")


def _stop(*procs: Any) -> None:
    for p in procs:
        p.kill()
        p.wait()


def run_cell(
    kind: str, mode: str, a: Node, b: Node, size: int, seconds: float, relay_c: str | None = None
) -> float:
    """One cell: the measuring end (requester, or receiver for one-way) reports its rate. ``relay_c``: the
    compiled relay (:func:`relay_c_binary`), for kinds ``relay-c`` and ``relay-c-stack``."""
    relays: list[Any] = []
    if kind == "relay" or kind in COMPILED:
        compiled = kind in COMPILED
        if compiled and relay_c is None:
            raise ValueError(f"{kind} needs the compiled relay")
        lead = () if compiled else ("relay",)  # this script's subcommand; relay.c takes the rest as it is
        tail = ("stack",) if kind == "relay-c-stack" else ()
        port = str(RELAY_TCP_PORT)
        for node, tag, role, peer in ((b, "b", "listen", "-"), (a, "a", "connect", b.addr)):
            relays.append(
                _spawn(node, *lead, tag, role, peer, port, *tail, binary=relay_c if compiled else None)
            )
            _ready(relays[-1])  # the listener first: the other one dials it
        # the ends are the same relay clients (stack mode: which also read the readiness fd)
        kind = "relay-stack" if tail else "relay"
        at_a, at_b = "a", "b"
    else:
        at_a, at_b = a.addr, b.addr
    t = str(seconds)
    try:
        if mode == "rr":
            other = _spawn(b, "end", kind, "resp", at_b, a.addr, "0", t)
            _ready(other)
            measuring = _spawn(a, "end", kind, "req", at_a, b.addr, str(size), t)
        else:
            measuring = _spawn(b, "end", kind, "recv", at_b, a.addr, "0", t)
            _ready(measuring)
            other = _spawn(a, "end", kind, "send", at_a, b.addr, str(size), t)
            _ready(other)
        out, _ = measuring.communicate(timeout=seconds + 120)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"{kind} {mode} {size} B: no rate")
        rate = float(json.loads(lines[-1])["rate"])
        _stop(other)
    finally:
        _stop(*relays)
    return rate


def floor_pair(tag: str) -> tuple[Node, Node]:
    """The namespace pair the cells run in (topology.make_pair), its stacks dialing each other on
    USERSPACE_PORT."""
    a, b = make_pair(tag, "10.97.0")
    for node in (a, b):
        node.env.update({"PYRDS_TCP_PORT": str(USERSPACE_PORT), "PYRDS_TCP_PEER_PORT": str(USERSPACE_PORT)})
    return a, b


def check_kinds(kinds: Sequence[str]) -> None:
    """ValueError naming every kind not in :data:`ALL_KINDS`."""
    unknown = sorted(set(kinds) - set(ALL_KINDS))
    if unknown:
        raise ValueError(f"unknown kinds: {', '.join(unknown)} (known: {', '.join(ALL_KINDS)})")


def measure(seconds: float, repeat: int, kinds: Sequence[str] = KINDS) -> list[dict[str, Any]]:
    """Every cell of CELLS for every kind, alternating, ``repeat`` times, in one namespace pair of its own
    (the stacks dial each other on USERSPACE_PORT; no nftables redirect, which topology.userspace_node adds
    for mixed pairs: the kernel's RDS/TCP keeps 16385 to itself here)."""
    check_kinds(kinds)
    relay_c = relay_c_binary() if COMPILED & set(kinds) else None
    kinds = [k for k in kinds if k not in COMPILED or relay_c is not None]
    a, b = floor_pair("fl")
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(repeat):
            for mode, size in CELLS:
                for kind in kinds:
                    rate = run_cell(kind, mode, a, b, size, seconds, relay_c)
                    rows.append(
                        {"kind": kind, "mode": mode, "size": size, "rep": rep, "msgs_per_s": round(rate, 1)}
                    )
                    print(
                        f"[floor] {kind:9} {mode:6} {size:6} B: {rate:8.1f} msgs/s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        teardown([a, b])
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("end", "relay"):
        if sys.argv[1] == "relay":
            port = int(sys.argv[5]) if len(sys.argv) > 5 else None
            cmd_relay(sys.argv[2], sys.argv[3] == "listen", sys.argv[4], port)
        else:
            kind, role, addr, peer, size, seconds = sys.argv[2:8]
            cmd_end(kind, role, addr, peer, int(size), float(seconds))
        return
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-T", "--duration", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--kinds", default=",".join(KINDS), help=f"rows, comma-separated, of {', '.join(ALL_KINDS)}"
    )
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    try:
        check_kinds(kinds)
    except ValueError as exc:
        ap.error(f"--kinds: {exc}")
    rows = measure(args.duration, args.repeat, kinds)
    for (mode, size), rates in best_rates(rows).items():
        line = f"{mode} {size} B, best msgs/s: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
        if {"kernel", "relay", "userspace"} <= rates.keys():
            k, r, u = rates["kernel"], rates["relay"], rates["userspace"]
            line += (
                f"; relay/kernel {r / k:.2f}x, userspace/kernel {u / k:.2f}x, userspace/relay {u / r:.2f}x"
            )
        if {"kernel", "relay-c", "userspace"} <= rates.keys():
            k, c, u = rates["kernel"], rates["relay-c"], rates["userspace"]
            line += f"; relay-c/kernel {c / k:.2f}x, userspace/relay-c {u / c:.2f}x"
        if {"kernel", "relay-c-stack"} <= rates.keys():
            line += f"; relay-c-stack/kernel {rates['relay-c-stack'] / rates['kernel']:.2f}x"
        print(line, flush=True)
    print("PYRDS-FLOOR-JSON " + json.dumps({"rows": rows, "kernel": os.uname().release}), flush=True)


if __name__ == "__main__":
    main()
