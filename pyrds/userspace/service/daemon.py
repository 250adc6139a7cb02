"""The daemon process: ``python -m pyrds.userspace.service [--shared|--private] [--detach]`` runs :func:`main`
(logging, the listener, RDS/TCP, RDS/IB where there is an RDMA device and pyverbs, the loop until idle). A
second service in the same namespace loses the bind race with EADDRINUSE and exits 0.

``--shared`` serves the namespace's shared stack (every uid) and needs euid 0 (exit 2 otherwise);
``--private`` serves the calling uid's private stack (``<name>-uid<N>``) only. Without either, root serves the
shared stack and any other uid its private one. The process makes itself not dumpable
(``prctl(PR_SET_DUMPABLE, 0)``): /proc/<pid>/mem, ptrace and core dumps are then for root only, not for
other processes of the same uid.

``--detach`` (what a client's autostart passes): the process forks once more and the parent exits at once,
so the starting client reaps it right away and the service is nobody's child (never a zombie in the client
when it exits); with ``start_new_session`` for the first child this is the classic double fork. Without it
the service stays in the foreground (systemd, tests).

``--no-idle-exit`` (what ``pyrds stack start`` and the systemd units pass): serve until stopped, whatever
``PYRDS_IDLE_EXIT`` says; a stack started on purpose does not go away with its last client. SIGTERM and
SIGINT stop the service cleanly (connections closed, listener released), as does the STOP control operation
(``pyrds stack stop``). Under systemd (``$NOTIFY_SOCKET``, Type=notify) the service sends ``READY=1`` once
its control socket is bound.

``PYRDS_STACK_PROFILE=<dir>`` (for whoever measures the service, docs/userspace-profile.md): the service runs
under cProfile and, when it stops, writes ``<dir>/stack-<pid>.prof`` (``pstats`` reads it), created new with
mode 0600 and never through a symbolic link. Only the environment of the process that starts the service sets
it, with that process's own rights (the shared stack is root's; an autostarted private one its uid's).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
from types import FrameType

from pyrds.userspace.config import StackConfig
from pyrds.userspace.service.server import Service

__all__ = ["main"]

log = logging.getLogger("pyrds.userspace.service")


#: free bytes glibc keeps at the heap's top before it shrinks the heap (a few 256 KiB receive buffers)
TRIM_THRESHOLD = 2 << 20


def _tune_malloc() -> None:
    """Keep large receive buffers off mmap: every ``recv(256 KiB)`` of the TCP path allocates the bytes object
    above glibc's 128 KiB mmap threshold and shrinks it, which costs mmap + mremap + munmap and fresh page
    faults per read (a freed shrunk chunk never raises the dynamic threshold). Setting the threshold also
    fixes the trim threshold at its 128 KiB default, so the same buffer then grew the heap with brk and
    gave it back with brk on every read (two syscalls and a fresh page fault per message): keep up to
    M_TRIM_THRESHOLD free at the heap's top (closing a large queue still calls malloc_trim). glibc only;
    best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(8 << 20))  # M_MMAP_THRESHOLD
        libc.mallopt(ctypes.c_int(-1), ctypes.c_int(TRIM_THRESHOLD))  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


PR_SET_DUMPABLE = 4  # include/uapi/linux/prctl.h


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): another process of our uid can no longer read our memory (/proc/PID/mem,
    ptrace) nor would a core dump hold queued messages. Best effort (glibc via ctypes)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)
        if libc.prctl(ctypes.c_int(PR_SET_DUMPABLE), zero, zero, zero, zero) != 0:
            log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("cannot make the service non-dumpable: %s", exc)


def _sd_notify(state: str) -> None:
    """sd_notify(3) with the stdlib: one datagram to $NOTIFY_SOCKET (a path, or @abstract). Best effort."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path or path[0] not in "/@":
        return
    addr = "\0" + path[1:] if path[0] == "@" else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as exc:
        log.warning("sd_notify(%s) failed: %s", state, exc)


def _owner(argv: list[str]) -> int | None:
    """The uid the service serves alone (a private stack) or None (the shared stack); ValueError: misuse."""
    euid = os.geteuid()
    if argv == ["--shared"]:
        if euid != 0:
            raise ValueError("--shared needs euid 0: only root serves the shared stack")
        return None
    if argv == ["--private"]:
        return euid
    if not argv:
        return None if euid == 0 else euid
    usage = "python -m pyrds.userspace.service [--shared|--private] [--detach] [--no-idle-exit]"
    raise ValueError(f"usage: {usage}, not {argv}")


def main(argv: list[str] | None = None) -> int:
    _tune_malloc()
    logging.basicConfig(
        level=os.environ.get("PYRDS_LOG", "WARNING"),
        stream=sys.stderr,
        format="pyrds-stack[%(process)d] %(levelname)s %(message)s",
    )
    args = list(sys.argv[1:] if argv is None else argv)
    detach = "--detach" in args
    if detach:
        args.remove("--detach")
    forever = "--no-idle-exit" in args
    if forever:
        args.remove("--no-idle-exit")
    try:
        owner = _owner(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if detach and os.fork() != 0:
        os._exit(0)  # the starter reaps this parent at once; the service goes on in the child
    _not_dumpable()
    config = StackConfig(owner=owner)
    if forever:
        config.idle_exit = -1
    svc = Service(config=config)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        svc.stop()  # serve_forever returns within its 0.5 s poll and closes everything

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        svc.bind()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return 0  # another service won the race: clients use it
        raise
    try:
        svc.start_tcp()
    except (OSError, ImportError) as exc:
        log.warning("RDS/TCP listener unavailable (%s): loop transport only", exc)
    try:
        if svc.start_ib():
            log.info("RDS/IB attached (sockets with SO_RDS_TRANSPORT=IB)")
    except Exception as exc:  # best effort: pyverbs missing or broken, no usable device
        log.warning("RDS/IB unavailable (%s: %s): running without it", type(exc).__name__, exc)
    _sd_notify("READY=1")
    profile_dir = os.environ.get("PYRDS_STACK_PROFILE")
    if profile_dir:
        _serve_profiled(svc, profile_dir)
    else:
        svc.serve_forever()
    _sd_notify("STOPPING=1")
    return 0


def _serve_profiled(svc: Service, directory: str) -> None:
    """``serve_forever`` under cProfile; the statistics go to ``<directory>/stack-<pid>.prof`` once it
    returns (or raises). A file that cannot be written is logged: the service's own exit stays as it was."""
    import cProfile
    import marshal

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        svc.serve_forever()
    finally:
        profiler.disable()
        profiler.create_stats()
        path = os.path.join(directory, f"stack-{os.getpid()}.prof")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                # pstats' file format (what Profile.dump_stats writes): our own statistics, not foreign bytes
                marshal.dump(profiler.stats, out)
        except OSError as exc:
            log.warning("PYRDS_STACK_PROFILE: cannot write %s: %s", path, exc)
