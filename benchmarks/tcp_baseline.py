"""Plain TCP request/response and one-way baseline with the same options and JSON as ``pyrds stress``.

Frames are a 4-byte big-endian length + payload; the first frame is a JSON hello, a length of 0xFFFFFFFF ends
the run (the server answers with a JSON frame carrying what it received).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
from collections import deque
from typing import Any, BinaryIO

FIN = 0xFFFFFFFF
LEN = struct.Struct("!I")


def read_frame(f: BinaryIO) -> bytes | None:
    head = f.read(4)
    if len(head) < 4:
        raise ConnectionError("peer closed")
    (n,) = LEN.unpack(head)
    if n == FIN:
        return None
    data = f.read(n)
    if len(data) < n:
        raise ConnectionError("peer closed mid-frame")
    return data


def serve(addr: str, port: int, once: bool) -> int:
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((addr, port))
        ls.listen(8)
        print(f"tcp baseline passive on {addr}:{port}", file=sys.stderr, flush=True)
        while True:
            conn, _peer = ls.accept()
            with conn, conn.makefile("rb") as rf:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = json.loads(read_frame(rf) or b"{}")
                reply = LEN.pack(int(hello.get("ack", 0))) + bytes(int(hello.get("ack", 0)))
                rr = hello.get("mode") == "rr"
                received = 0
                while True:
                    data = read_frame(rf)
                    if data is None:
                        done = json.dumps({"received": received}).encode()
                        conn.sendall(LEN.pack(len(done)) + done)
                        break
                    received += 1
                    if rr:
                        conn.sendall(reply)
            if once:
                return 0


def client(args: argparse.Namespace) -> int:
    fam = socket.AF_INET6 if ":" in args.peer else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if args.local:
        sock.bind((args.local, 0))
    sock.connect((args.peer, args.port))
    rf = sock.makefile("rb")
    hello = json.dumps({"mode": args.mode, "ack": 0}).encode()
    sock.sendall(LEN.pack(len(hello)) + hello)
    frame = LEN.pack(args.size) + bytes(args.size)
    rtts: list[float] = []
    sent = 0
    cpu0, t0 = sum(os.times()[:2]), time.monotonic()
    end = t0 + args.duration
    if args.mode == "rr":
        sent_at: deque[float] = deque()
        while True:
            now = time.monotonic()
            while now < end and len(sent_at) < args.depth:
                sock.sendall(frame)
                sent_at.append(time.monotonic())
                sent += 1
            if not sent_at:
                break
            read_frame(rf)
            rtts.append((time.monotonic() - sent_at.popleft()) * 1e6)
    else:
        while time.monotonic() < end:
            sock.sendall(frame)
            sent += 1
    sock.sendall(LEN.pack(FIN))
    done = json.loads(read_frame(rf) or b"{}")
    elapsed = time.monotonic() - t0
    cpu = (sum(os.times()[:2]) - cpu0) / elapsed * 100
    sock.close()
    messages = len(rtts) if args.mode == "rr" else int(done.get("received", 0))
    rtts.sort()
    rtt: dict[str, float] | None = None
    if rtts:

        def pick(q: float) -> float:
            return rtts[min(len(rtts) - 1, int(round(q / 100 * (len(rtts) - 1))))]

        rtt = {
            "min": rtts[0],
            "avg": sum(rtts) / len(rtts),
            "p50": pick(50),
            "p99": pick(99),
            "max": rtts[-1],
        }
    doc: dict[str, Any] = {
        "backend": "tcp",
        "mode": args.mode,
        "size": args.size,
        "depth": args.depth,
        "seconds": round(elapsed, 3),
        "messages": messages,
        "msgs_per_s": round(messages / elapsed, 1),
        "mb_per_s": round(messages * args.size / elapsed / 1e6, 3),
        "rtt_us": rtt,
        "cpu_pct": round(cpu, 1),
        "errors": [],
    }
    print(json.dumps(doc), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-s", dest="local", default=None)
    ap.add_argument("-r", dest="peer", default=None)
    ap.add_argument("-p", dest="port", type=int, default=5201)
    ap.add_argument("-q", dest="size", type=int, default=1024)
    ap.add_argument("-d", dest="depth", type=int, default=1)
    ap.add_argument("-T", dest="duration", type=float, default=5.0)
    ap.add_argument("--one-way", dest="mode", action="store_const", const="oneway", default="rr")
    ap.add_argument("--passive", action="store_true")
    ap.add_argument("--once", action="store_true")
    args = ap.parse_args(argv)
    if args.passive or not args.peer:
        return serve(args.local or "127.0.0.1", args.port, args.once)
    return client(args)


if __name__ == "__main__":
    sys.exit(main())
