"""What a process switch adds to the Python work done right after it (issue 10, docs/userspace-profile.md).

The userspace stack wakes six processes per request/response round trip (each client and each service,
twice per service), the kernel two. This measures, in one process pair and without RDS, the same fixed piece
of Python work per message three ways:

- ``alone``: in a loop that never sleeps;
- ``pingpong``: in each of two processes that wake each other through a pair of pipes (one switch per
  message per side; user and system CPU are the measuring side's);
- ``syscalls``: with the same write and read on one pipe in one process (the system calls, no switch).

``pingpong`` user time over ``alone`` is what waking costs the work that follows it (caches and, under QEMU
TCG, the soft TLB, emptied by the switch). ``--work`` sets the piece's size (loop iterations); ``--pages``
adds to it a write into each of that many distinct pages of the process's own memory, so that what a switch
costs per page the work touches shows (``pingpong`` against ``syscalls``, which runs the same calls and
writes without a switch). The
kernel splits a process's CPU time into user and system by sampling at its ticks (the sum is exact), so
the split is fair over thousands of messages, not over a few hundred.
``python benchmarks/wakeup_cost.py [--work 50,200,400] [--pages 0,256,1024] [--messages 3000]``; the last
line is
``PYRDS-WAKEUP-JSON``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable


def work(n: int) -> int:
    """A fixed piece of interpreter work: dict stores, len, arithmetic."""
    d: dict[int, int] = {}
    acc = 0
    for i in range(n):
        d[i & 15] = i
        acc += len(d) + (i ^ 7)
    return acc


PAGE = 4096


def touch(memory: bytearray, pages: int) -> None:
    """One byte written into each of the first ``pages`` pages of ``memory``."""
    for i in range(0, pages * PAGE, PAGE):
        memory[i] = (memory[i] + 1) & 0xFF


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _measure(loop: Callable[[], None], messages: int) -> dict[str, float]:
    u0, s0 = _cpu()
    t0 = time.monotonic()
    loop()
    t1 = time.monotonic()
    u1, s1 = _cpu()
    return {
        "user_us": round((u1 - u0) / messages * 1e6, 1),
        "sys_us": round((s1 - s0) / messages * 1e6, 1),
        "wall_us": round((t1 - t0) / messages * 1e6, 1),
    }


def alone(n: int, messages: int, pages: int = 0) -> dict[str, float]:
    memory = bytearray(pages * PAGE)

    def loop() -> None:
        for _ in range(messages):
            work(n)
            touch(memory, pages)

    return _measure(loop, messages)


def pingpong(n: int, messages: int, pages: int = 0) -> dict[str, float]:
    memory = bytearray(pages * PAGE)  # each side writes its own copy after the fork (copied once, at first)
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the other side
        try:
            os.close(to_child_w)
            os.close(to_parent_r)
            for _ in range(messages):
                if not os.read(to_child_r, 1):
                    break
                work(n)
                touch(memory, pages)
                os.write(to_parent_w, b"x")
        finally:
            os._exit(0)
    os.close(to_child_r)
    os.close(to_parent_w)

    replies = 0

    def loop() -> None:
        nonlocal replies
        for _ in range(messages):
            os.write(to_child_w, b"x")
            replies += len(os.read(to_parent_r, 1))  # the other side's answer, after its work
            work(n)
            touch(memory, pages)

    try:
        return {**_measure(loop, messages), "replies": replies}
    finally:
        os.close(to_child_w)
        os.close(to_parent_r)
        os.waitpid(pid, 0)


def syscalls(n: int, messages: int, pages: int = 0) -> dict[str, float]:
    memory = bytearray(pages * PAGE)
    r, w = os.pipe()

    def loop() -> None:
        for _ in range(messages):
            os.write(w, b"x")
            os.read(r, 1)
            work(n)
            touch(memory, pages)

    try:
        return _measure(loop, messages)
    finally:
        os.close(r)
        os.close(w)


Row = dict[str, float | int | str]


def measure(sizes: list[int], messages: int, page_counts: list[int] | None = None) -> list[Row]:
    rows: list[Row] = []
    for pages in page_counts or [0]:
        for n in sizes:
            for way, fn in (("alone", alone), ("pingpong", pingpong), ("syscalls", syscalls)):
                rows.append({"work": n, "pages": pages, "way": way, **fn(n, messages, pages)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="50,200,400", help="loop iterations per message, comma-separated")
    ap.add_argument("--pages", default="0", help="distinct pages written per message, comma-separated")
    ap.add_argument("--messages", type=int, default=3000)
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.work.split(",") if x.strip()]
        page_counts = [int(x) for x in args.pages.split(",") if x.strip()]
    except ValueError:
        ap.error("--work and --pages are comma lists of integers")
    if not sizes or min(sizes) < 0 or args.messages <= 0:
        ap.error("--work needs sizes >= 0 and --messages > 0")
    if not page_counts or not all(0 <= p <= 65536 for p in page_counts):
        ap.error("--pages needs counts from 0 to 65536")
    rows = measure(sizes, args.messages, page_counts)
    for row in rows:
        print(f"work {row['work']:>5} pages {row['pages']:>5} {row['way']:<9} user {row['user_us']:>8} us/msg"
              f"  sys {row['sys_us']:>6}  wall {row['wall_us']:>8}", flush=True)
    print("PYRDS-WAKEUP-JSON " + json.dumps(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
