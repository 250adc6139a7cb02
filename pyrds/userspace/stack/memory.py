"""The memory boundary for RDMA: the service reads and writes a client's memory with ``process_vm_readv`` /
``process_vm_writev`` against the client's pid (SO_PEERCRED of its control connection).

An RDS socket's RDMA operations name addresses in the client process (the ``rds_iovec`` of an
``RDS_CMSG_RDMA_ARGS``, the region of an ``RDS_CMSG_RDMA_MAP``, its cookie address, an atomic's local word),
while the queue pairs and the registered buffers live in the service. The service copies between the two
(docs/userspace.md, "RDMA operations"):

- only the pid of the connection the request came on is ever named, so a client can only name its own
  memory; before each access the pid must still be a process of the peer's uid (a recycled pid of another
  user gives EFAULT); the kernel's own ptrace check (``PTRACE_MODE_ATTACH_REALCREDS``) applies on top;
- every access is bounded (:data:`MAX_ACCESS` bytes, no address wrap) before any system call;
- any failure -- an unmapped or unreadable address, a short transfer, a vanished process -- is an EFAULT
  (:class:`~pyrds.userspace.stack.errors.StackError`) for that caller's request only.

An in-process stack (unit tests, an embedded stack) uses :func:`own_memory`: the same calls on its own pid,
which the kernel always allows and which fail with EFAULT instead of crashing on a bad address.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from typing import Any

from pyrds.userspace.stack.errors import StackError

__all__ = ["MAX_ACCESS", "ClientMemory", "own_memory"]

#: the largest single access: an RDMA region is at most RDS_MAX_MSG_SIZE (1 MiB) plus a page each side
MAX_ACCESS = (1 << 20) + 2 * 4096
_ADDR_END = 1 << 64


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


@functools.cache
def _calls() -> tuple[Any, Any]:
    """libc's process_vm_readv and process_vm_writev, typed; looked up on first use, not at import."""
    libc = ctypes.CDLL(None, use_errno=True)
    fns = (libc.process_vm_readv, libc.process_vm_writev)
    for fn in fns:
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = (
            ctypes.c_int,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        )
    return fns


def _check_range(addr: int, length: int) -> None:
    if length < 0 or length > MAX_ACCESS or addr < 0 or addr + length > _ADDR_END:
        raise StackError(errno.EFAULT)


class ClientMemory:
    """One client's memory, by pid; ``uid``: the peer's uid to re-check before each access (None: don't)."""

    __slots__ = ("pid", "uid")

    def __init__(self, pid: int, uid: int | None = None) -> None:
        self.pid = pid
        self.uid = uid

    def __repr__(self) -> str:
        return f"<ClientMemory pid {self.pid}>"

    def _still_peer(self) -> None:
        if self.uid is None:
            return
        try:
            st = os.stat(f"/proc/{self.pid}")
        except OSError:
            raise StackError(errno.EFAULT) from None
        if st.st_uid != self.uid:
            raise StackError(errno.EFAULT)

    def read(self, addr: int, length: int) -> bytes:
        """``length`` bytes at ``addr`` in the client; EFAULT unless all of them could be read."""
        _check_range(addr, length)
        if length == 0:
            return b""
        self._still_peer()
        buf = ctypes.create_string_buffer(length)
        local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), length)
        remote = _IoVec(addr, length)
        n = _calls()[0](self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n != length:
            raise StackError(errno.EFAULT)
        return buf.raw

    def write(self, addr: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``addr`` in the client; EFAULT unless all of it was written (a failed write may
        have written a prefix, as a faulting copy_to_user may)."""
        length = len(data)
        _check_range(addr, length)
        if length == 0:
            return
        self._still_peer()
        buf = ctypes.create_string_buffer(bytes(data), length)
        local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), length)
        remote = _IoVec(addr, length)
        n = _calls()[1](self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n != length:
            raise StackError(errno.EFAULT)


def own_memory() -> ClientMemory:
    """This process's own memory (an in-process caller)."""
    return ClientMemory(os.getpid())
