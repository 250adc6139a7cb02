"""Every RDS/TCP path's ``next_rx_seq``, kept in a file: a restarted service knows what its readers got.

A service killed (SIGKILL, a crash) is its node's kernel crashing, but its clients live on and open new
sockets. The surviving peer resends, with RETRANSMITTED and their old sequence numbers, the messages its TCP
saw no ACK for; the kernel's receiver drops those below the path's ``next_rx_seq`` (``rds_recv_incoming``),
which a new service would not know. Without this file the service makes sure the ACK is out before any
reader can see a message (``_acked_read`` in :mod:`.path`: TCP_QUICKACK and SIOCINQ after every read, and a
pure ACK segment per message in request/response). With it, the path stores ``seq + 1`` here before the
message can reach a reader (one 8-byte store into a shared mapping, which a killed process cannot tear), and
a new service's paths start from what it holds: the resent copies of what readers already had are dropped
as old, and what the TCP had not passed on yet comes again and is taken. docs/userspace.md, "Restart".

The file is trusted like the service: in a directory of the service's own uid that nobody else may write
(``/run/pyrds`` for root's shared stack; ``$XDG_RUNTIME_DIR/pyrds`` for a private stack; none, so no file,
otherwise), mode 0600, not a link, locked by the one service of the stack (another process of the same name
cannot share it), named by the stack's name and the network namespace's cookie (``SO_NETNS_COOKIE``: never
reused while the machine runs). A clean exit removes it (the kernel forgets ``next_rx_seq`` when its
connections are destroyed). Its contents are checked before use: a file of another size or magic starts
empty. A path whose key finds no free slot (:data:`SLOTS`) keeps the ACK-before-push rule.

Path 0's slot also keeps what the peer said in its last probe or pong (NPATHS, SPORT_IDX). A 7.x owner
re-dials every path at once after the reset, each from a source port that names it; a new acceptor that
knew nothing would take whichever came first for path 0 (a 7.x kernel acceptor does the same, and drops it
again once the owner's probe says SPORT_IDX, 7.x ``rds_tcp_conn_slots_available``) and leave the owner's
path 0, with that probe, waiting unread behind it: messages of one path would meet another path's receive
sequence, and a receiver that never sends has no ping of its own to break the wait. With the pairing kept,
the new service pairs every connection by its port from the first one, as the old one did.

Each slot also keeps a reserved send sequence: a path writes nothing numbered at or above it, raising it a
block ahead (:data:`pyrds.userspace.transports.tcp.path.TX_RESERVE`) before it would, and a new service's path
numbers on from it instead of from 1. The survivor's ``next_rx_seq`` for the path is at most one above the
last number it received, so the new service's messages, resent with RETRANSMITTED after a reset of its first
connection, are never below it and never dropped as old (from 1 again they could be: nothing on the wire tells
a peer before 7.x of a new incarnation, and the stack sends no GEN_NUM). A gap in the numbers is nothing to a
receiver: ``rds_recv_incoming`` only compares with ``next_rx_seq``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import re
import socket
import stat
import struct

from pyrds.addr import IPAddress

__all__ = ["SLOTS", "RxSeqPage", "open_page", "page_path"]

log = logging.getLogger("pyrds.userspace.tcp")

MAGIC = b"PYRDSRX2"
#: slots for (laddr, faddr, path) keys: 128 peers of 8 paths each
SLOTS = 1024
_HEADER = 64
#: laddr (16, IPv4 left-aligned), faddr (16), IP version (0: a free slot), path index, the peer's NPATHS and
#: pairing flags (path 0's slot only: see :meth:`RxSeqPage.pairing`), 4 pad, next_rx_seq, the send sequence
#: reserved (:meth:`RxSeqPage.tx_reserved`)
_SLOT = struct.Struct("=16s16sBBBB4xQQ")
_SEQ = struct.Struct("=Q")
_SEQ_AT = 40
_TX_AFTER_SEQ = 8  # the reserved send sequence follows next_rx_seq
_PAIRING = struct.Struct("=BB")
_PAIRING_BEFORE_SEQ = _SEQ_AT - struct.calcsize("=16s16sBB")  # NPATHS and flags follow the key in a slot
_SPORT_IDX = 1
SIZE = _HEADER + SLOTS * _SLOT.size
#: socket(7) SO_NETNS_COOKIE (Linux 5.14)
_SO_NETNS_COOKIE = 71
_ROOT_DIR = "/run/pyrds"
_PLAIN = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: files a directory keeps at most: a service killed in a namespace that is then deleted leaves its file
#: behind (a cookie cannot be looked up), so a service that starts removes the oldest unlocked ones beyond it
MAX_FILES = 256


def _netns_cookie() -> int | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            raw = s.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8)
    except OSError:
        return None
    return int.from_bytes(raw, "little") if len(raw) == 8 else None


def _private_dir(path: str) -> bool:
    """``path`` is a directory (not a link) owned by us that nobody else can write or enter."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def page_dir(owner: int | None) -> str | None:
    """The directory of the pages of this uid's stacks, made if missing; None when there is no safe one."""
    if owner is None and os.geteuid() == 0:
        parent, path = "/run", _ROOT_DIR
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        if not runtime or not os.path.isabs(runtime) or not _private_dir(runtime):
            return None
        parent, path = runtime, os.path.join(runtime, "pyrds")
    with contextlib.suppress(OSError):  # FileExistsError: made before
        if os.path.isdir(parent):
            os.mkdir(path, 0o700)
    return path if _private_dir(path) else None


def page_path(directory: str, served_name: str, cookie: int) -> str:
    """The file of one stack in one network namespace (a name that is not plain is hashed)."""
    if _PLAIN.fullmatch(served_name):
        safe = served_name
    else:
        safe = "h" + hashlib.sha256(served_name.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(directory, f"{safe}.{cookie:016x}.rxseq")


def _key(laddr: IPAddress, faddr: IPAddress, index: int) -> tuple[bytes, bytes, int, int]:
    return laddr.packed.ljust(16, b"\0"), faddr.packed.ljust(16, b"\0"), laddr.version, index


class RxSeqPage:
    """The mapped file: :meth:`slot` finds or takes a path's slot, :meth:`resume` reads it, :meth:`store`
    writes it."""

    def __init__(self, fd: int, mm: mmap.mmap, path: str) -> None:
        self._fd = fd
        self._mm = mm
        self.path = path
        self._closed = False
        self._slots: dict[tuple[bytes, bytes, int, int], int] = {}
        self._free: list[int] = []
        for i in range(SLOTS - 1, -1, -1):
            la, fa, version, index = _SLOT.unpack_from(mm, _HEADER + i * _SLOT.size)[:4]
            if version in (4, 6) and index < 256:
                self._slots.setdefault((la, fa, version, index), i)
            else:
                self._free.append(i)

    def slot(self, laddr: IPAddress, faddr: IPAddress, index: int) -> int | None:
        """The byte offset of the path's ``next_rx_seq``; None when every slot is taken, or once closed (a
        connection still draining while the stack stops may add a path)."""
        if self._closed:
            return None
        key = _key(laddr, faddr, index)
        i = self._slots.get(key)
        if i is None:
            if not self._free:
                return None
            i = self._free.pop()
            # the sequence first: a slot taken halfway (a kill between the stores) reads as free or as 0
            _SEQ.pack_into(self._mm, _HEADER + i * _SLOT.size + _SEQ_AT, 0)
            _SEQ.pack_into(self._mm, _HEADER + i * _SLOT.size + _SEQ_AT + _TX_AFTER_SEQ, 0)
            _SLOT.pack_into(self._mm, _HEADER + i * _SLOT.size, *key, 0, 0, 0, 0)
            self._slots[key] = i
        return _HEADER + i * _SLOT.size + _SEQ_AT

    def resume(self, at: int) -> int:
        if self._closed:
            return 0
        value: int = _SEQ.unpack_from(self._mm, at)[0]
        return value

    def store(self, at: int, next_rx_seq: int) -> None:
        if not self._closed:  # closed: a path still reading while the stack stops (its readers are gone)
            _SEQ.pack_into(self._mm, at, next_rx_seq)

    def tx_reserved(self, at: int) -> int:
        """The send sequence the path whose ``next_rx_seq`` is at ``at`` reserved: every message an earlier
        service wrote on it had a lower number (0: nothing reserved)."""
        if self._closed:
            return 0
        value: int = _SEQ.unpack_from(self._mm, at + _TX_AFTER_SEQ)[0]
        return value

    def reserve_tx(self, at: int, through: int) -> None:
        if not self._closed:
            _SEQ.pack_into(self._mm, at + _TX_AFTER_SEQ, through)

    def pairing(self, at: int) -> tuple[int, bool]:
        """What the peer of the path whose sequence is at ``at`` (its path 0) last said in a probe or pong:
        its NPATHS and whether it names paths by source port (SPORT_IDX); (0, False) when nothing was kept."""
        if self._closed:
            return 0, False
        npaths, flags = _PAIRING.unpack_from(self._mm, at - _PAIRING_BEFORE_SEQ)
        return int(npaths), bool(flags & _SPORT_IDX)

    def store_pairing(self, at: int, npaths: int, sport_idx: bool) -> None:
        if not self._closed:
            flags = _SPORT_IDX if sport_idx else 0
            _PAIRING.pack_into(self._mm, at - _PAIRING_BEFORE_SEQ, max(0, min(npaths, 255)), flags)

    def close(self, remove: bool) -> None:
        """Unmap; ``remove`` (a clean exit) also deletes the file."""
        self._closed = True
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(BufferError, ValueError):
            self._mm.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_page(owner: int | None, served_name: str, directory: str | None = None) -> RxSeqPage | None:
    """The stack's page, made or taken over from a killed service; None (with a log line) when there is no
    safe place for it: the stack then keeps the ACK-before-push rule."""
    cookie = _netns_cookie()
    if directory is None:
        directory = page_dir(owner)
    if cookie is None or directory is None or not _private_dir(directory):
        log.info("RDS/TCP: no private directory or netns cookie for the receive sequences; ACK before push")
        return None
    path = page_path(directory, served_name, cookie)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log.warning("RDS/TCP: cannot open %s (%s); ACK before push", path, exc)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise OSError(f"{path} is not a private regular file of uid {os.geteuid()}")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another live service of this name: not ours
        fresh = st.st_size != SIZE or os.pread(fd, len(MAGIC), 0) != MAGIC
        if fresh:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, SIZE)
            os.pwrite(fd, MAGIC, 0)
        mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as exc:
        os.close(fd)
        log.warning("RDS/TCP: cannot use %s (%s); ACK before push", path, exc)
        return None
    log.info("RDS/TCP: receive sequences kept in %s%s", path, " (new)" if fresh else "")
    prune(directory, path)
    return RxSeqPage(fd, mm, path)


def prune(directory: str, keep: str, limit: int = MAX_FILES) -> int:
    """Leave ``directory`` at most ``limit`` page files (``keep`` among them) by removing the oldest that no
    service holds (not locked); returns how many went."""
    try:
        entries = [e for e in os.scandir(directory) if e.name.endswith(".rxseq") and e.path != keep]
    except OSError:
        return 0
    excess = len(entries) + 1 - limit
    if excess <= 0:
        return 0
    aged: list[tuple[float, str]] = []
    for e in entries:
        with contextlib.suppress(OSError):
            aged.append((e.stat(follow_symlinks=False).st_mtime, e.path))
    aged.sort()
    removed = 0
    for _mtime, path in aged:
        if removed == excess:
            break
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a live service's
            os.unlink(path)
            removed += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed
