"""Tiny AF_RDS echo peer and client for the two-guests topology (kernel RDS through the stdlib socket;
pyrds is imported only for ``--backend userspace``).

Guest B: ``python3 -m vm.rds_echo serve`` (binds $PYRDS_LOCAL_ADDR:PORT, echoes every message back).
Guest A: ``python3 -m vm.rds_echo client --count 1000 --size 1024`` (sends to $PYRDS_PEER_ADDR:PORT,
waits for each echo, prints msg/s and MB/s; exit 0 only if every echo came back intact).
``--transport tcp|ib`` sets SO_RDS_TRANSPORT before bind (default: tcp; with rxe up the kernel would pick IB).
``--backend userspace`` makes the socket with ``pyrds.socket("userspace")`` (the guest's userspace stack;
for IB it listens on rdma_cm port 18634 only while rds_rdma is not loaded in that guest, so the caller
unloads it first: a kernel in the other guest then dials the userspace node).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

AF_RDS = 21
SOL_RDS = 276
SO_RDS_TRANSPORT = 8
TRANSPORTS = {"ib": 0, "tcp": 2}
PORT = 4000


def rds_socket(addr: str, port: int, transport: str, backend: str = "kernel") -> socket.socket:
    if backend == "userspace":
        import pyrds  # noqa: PLC0415 - only this mode needs pyrds (and, for IB, pyverbs) in the guest

        s: socket.socket = pyrds.socket("userspace")  # type: ignore[assignment]
    else:
        s = socket.socket(AF_RDS, socket.SOCK_SEQPACKET)
    s.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, TRANSPORTS[transport])
    s.bind((addr, port))
    return s


def serve(addr: str, port: int, transport: str, backend: str = "kernel") -> int:
    s = rds_socket(addr, port, transport, backend)
    print(f"rds_echo: serving on {addr}:{port} ({transport}, {backend})", file=sys.stderr, flush=True)
    while True:
        data, peer = s.recvfrom(1 << 20)
        while True:
            try:
                s.sendto(data, peer)
                break
            except OSError as exc:  # ENOBUFS when the peer port is congested: retry shortly
                if exc.errno != 105:
                    raise
                time.sleep(0.001)


def warm_up(s: socket.socket, peer: str, port: int, timeout: float, tries: int) -> int:
    """Send a probe until it is echoed; returns the attempts used (0: never).

    Measured on the 6.1 guests: the first message on a fresh connection between two guests is sometimes
    never echoed (both IB/rxe and TCP), so the timed loop starts only once one round trip worked.
    """
    for attempt in range(1, tries + 1):
        s.sendto(b"warm-up", (peer, port))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data, _ = s.recvfrom(1 << 20)
            except TimeoutError:
                break
            if data == b"warm-up":
                return attempt
    return 0


def client(
    addr: str,
    peer: str,
    port: int,
    transport: str,
    count: int,
    size: int,
    timeout: float,
    backend: str = "kernel",
) -> int:
    s = rds_socket(addr, port + 1, transport, backend)
    s.settimeout(timeout)
    tries = warm_up(s, peer, port, timeout, 3)
    if not tries:
        print(f"rds_echo: no echo of the warm-up message after 3 x {timeout} s", file=sys.stderr)
        return 1
    if tries > 1:
        print(f"rds_echo: warm-up needed {tries} attempts", file=sys.stderr)
    payload = os.urandom(size)
    t0 = time.monotonic()
    for i in range(count):
        msg = i.to_bytes(4, "big") + payload[4:] if size >= 4 else payload
        s.sendto(msg, (peer, port))
        try:
            data, _ = s.recvfrom(1 << 20)
            while data == b"warm-up":  # late echo of a retried warm-up
                data, _ = s.recvfrom(1 << 20)
        except TimeoutError:
            print(f"rds_echo: no echo for message {i} within {timeout} s", file=sys.stderr)
            return 1
        if data != msg:
            print(f"rds_echo: echo {i} differs ({len(data)} bytes)", file=sys.stderr)
            return 1
    dt = time.monotonic() - t0
    print(
        f"rds_echo: {count} x {size} B round trips over {transport} ({backend} client) in {dt:.2f} s: "
        f"{count / dt:.0f} msg/s, {2 * count * size / dt / 1e6:.2f} MB/s both ways"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vm.rds_echo")
    ap.add_argument("mode", choices=("serve", "client"))
    ap.add_argument("--addr", default=os.environ.get("PYRDS_LOCAL_ADDR", "127.0.0.1"))
    ap.add_argument("--peer", default=os.environ.get("PYRDS_PEER_ADDR", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=PORT)
    ap.add_argument("--transport", choices=tuple(TRANSPORTS), default="tcp")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--backend", choices=("kernel", "userspace"), default="kernel")
    args = ap.parse_args(argv)
    if args.mode == "serve":
        return serve(args.addr, args.port, args.transport, args.backend)
    return client(
        args.addr, args.peer, args.port, args.transport, args.count, args.size, args.timeout, args.backend
    )


if __name__ == "__main__":
    sys.exit(main())
