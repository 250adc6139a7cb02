"""Cost of the RDMA memory boundary (docs/userspace.md, "RDMA operations"): the service reads and writes a
client's memory with process_vm_readv / process_vm_writev (``pyrds.userspace.stack.memory.ClientMemory``).

Measures, against a child process holding a 1 MiB buffer: ``ClientMemory.read`` and ``.write`` for 8 B (a
cookie), 4 KiB, 64 KiB and 1 MiB, with and without the per-access peer check (a stat of /proc/<pid>), next
to an in-process copy of the same size (``ctypes.memmove``), best of 5 runs each; and the diff write-back
of a 1 MiB MR with one 4 KiB page changed (``stack.rdma.changed_runs``).
Run: ``python benchmarks/rdma_memory.py``.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyrds.userspace.stack import rdma  # noqa: E402
from pyrds.userspace.stack.memory import ClientMemory  # noqa: E402

CHILD = (
    "import ctypes,sys,time; b=ctypes.create_string_buffer(1<<20); "
    "print(ctypes.addressof(b), flush=True); sys.stdin.read()"
)


def per_call(fn: object, n: int, rounds: int = 5) -> float:
    """The best of ``rounds`` runs of ``n`` calls (the host is shared: the minimum is the cost)."""
    f = fn  # type: ignore[assignment]
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            f()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    addr = int(child.stdout.readline())
    checked = ClientMemory(child.pid, os.getuid())
    unchecked = ClientMemory(child.pid)
    local = ctypes.create_string_buffer(1 << 20)
    other = ctypes.create_string_buffer(1 << 20)
    print(f"{'size':>8} {'read':>10} {'read+chk':>10} {'write+chk':>10} {'memmove':>10}  (us per call)")
    for size in (8, 4096, 65536, 1 << 20):
        n = 500 if size <= 65536 else 50
        data = bytes(size)
        r = per_call(lambda s=size: unchecked.read(addr, s), n)
        rc = per_call(lambda s=size: checked.read(addr, s), n)
        wc = per_call(lambda d=data: checked.write(addr, d), n)
        mm = per_call(lambda s=size: ctypes.memmove(local, other, s), n)
        print(f"{size:>8} {r * 1e6:>10.1f} {rc * 1e6:>10.1f} {wc * 1e6:>10.1f} {mm * 1e6:>10.1f}")
    old = bytes(1 << 20)
    new = bytearray(old)
    new[8192 : 8192 + 4096] = b"x" * 4096
    new_b = bytes(new)
    d = per_call(lambda: list(rdma.changed_runs(old, new_b)), 50)
    print(f"changed_runs over 1 MiB (one page changed): {d * 1e3:.2f} ms")
    child.stdin.close()  # type: ignore[union-attr]
    child.wait()


if __name__ == "__main__":
    main()
