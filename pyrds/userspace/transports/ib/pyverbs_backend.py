"""The real :mod:`.verbs` interface over rdma-core's pyverbs (Debian bookworm's python3-pyverbs 44 and later).

Importing this module imports pyverbs; nothing else in pyrds imports this module unless IB is used. All
untyped pyverbs calls are here; every pyverbs error becomes a :class:`~.verbs.VerbsError`.

Workarounds for pyverbs <= 56 (rds-ib-facts.md 5.1-5.5, read in rdma-core v44.0 ``pyverbs/*.pyx``):

- Neither ``CMEventChannel`` nor ``CompChannel`` exposes its fd. Each is found by listing ``/proc/self/fd``
  before and after creating it and taking the one new fd whose link is ``/dev/infiniband/rdma_cm``
  (resp. ``anon_inode:[infinibandevent]``); it is then made ``O_NONBLOCK``, so ``rdma_get_cm_event`` and
  ``ibv_get_cq_event`` fail with EAGAIN instead of blocking (with the GIL held) when nothing is pending.
- ``CMEvent`` does not say which id an event is for: an active id gets its own channel; accepted ids share
  the listener's (see :class:`~.driver.IbListener`). Each event is acknowledged right after its private
  data is copied (``rdma_destroy_id`` waits for unacked events of its id).
- ``CMID.close`` sets its ``Context``/``PD`` wrappers' pointers to NULL, and an accepted id's wrappers are the
  *listener's*. The queue pair therefore opens its own device context (``Context(name=dev_name)``) and PD,
  and never uses the id's.
- ``CompChannel.get_cq_event`` raises (and leaves the event unacked) when the event is for another CQ than
  the one named: there is one CQ per QP, for sends and receives.
- ``MR`` has no iova argument (``ibv_reg_mr_iova2``), and RDS/IB remote addresses are zero-based (the kernel's
  FRWR MRs). A region for remote access is therefore a buffer we mmap, registered through libibverbs with
  ctypes, ``ibv_reg_mr_iova2(iova=0)``, in the QP's PD. pyverbs never exposes its ``struct ibv_pd *``: it is
  found in the ``PD`` object's memory (the word pointing at an ``ibv_pd`` with the PD's handle and a context
  pointer the ``Context`` object holds too; read with process_vm_readv on ourselves, so a wrong guess is an
  error, not a crash); failing that, the PD is imported into a second context on a dup of the command fd
  (``ibv_import_device``, ``ibv_import_pd``; rxe's provider cannot: EOPNOTSUPP, seen on 7.3). The local
  bounce buffers of RDMA ops are ordinary pyverbs ``MR`` objects.
- ``SendWR``/``RecvWR`` malloc their SGE array and never free it (the destructor is misspelt): every work
  request object is made once per queue pair and reused. A send WR's SGE list is pointed at a per-slot
  ``SGE`` (``wr.sg_list = sge``) whose ``length`` is set per post; these objects are never ``close()``d
  (that would free the SGE twice).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from pyrds.constants import RDS_HEADER_SIZE
from pyrds.userspace.transports.ib.verbs import (
    CmEvent,
    CmEventKind,
    Completion,
    ConnParams,
    QpConfig,
    VerbsError,
)

__all__ = ["PyverbsVerbs", "find_new_fd"]

_CM_DEV = "/dev/infiniband/rdma_cm"
_CQ_EVENT_LINK = "anon_inode:[infinibandevent]"
_POLL_BATCH = 64
_EVENTS_WITH_DATA = frozenset(
    {CmEventKind.CONNECT_REQUEST, CmEventKind.CONNECT_RESPONSE, CmEventKind.REJECTED, CmEventKind.ESTABLISHED}
)


def _fd_links() -> dict[int, str]:
    links: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            links[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except (OSError, ValueError):
            continue
    return links


def find_new_fd(before: dict[int, str], after: dict[int, str], link: str) -> int:
    """The one fd in ``after`` that is not in ``before`` (or now points elsewhere) and links to ``link``."""
    new = [fd for fd, target in after.items() if target == link and before.get(fd) != target]
    if len(new) != 1:
        raise VerbsError(f"cannot tell the {link} fd apart: candidates {sorted(new)}")
    return new[0]


def _is_ib_ca(dev: str) -> bool:
    """``node_type == RDMA_NODE_IB_CA`` (sysfs says "1: CA"); an unreadable node_type counts as a CA."""
    try:
        with open(f"/sys/class/infiniband/{dev}/node_type", encoding="ascii") as f:
            return f.read().split(":")[0].strip() == "1"
    except (OSError, ValueError):
        return True


def _gid_bytes(gid: Any) -> bytes:
    """pyverbs shows a GID as ``xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx`` (``GID`` objects via ``str``)."""
    raw = bytes.fromhex(str(gid).replace(":", ""))
    if len(raw) != 16:
        raise ValueError(f"not a GID: {gid!r}")
    return raw


class _Pv:
    """The pyverbs modules (imported on first use)."""

    def __init__(self) -> None:
        import pyverbs.cm_enums as ce
        import pyverbs.cmid as cmid
        import pyverbs.cq as cq
        import pyverbs.device as device
        import pyverbs.enums as e
        import pyverbs.mr as mr
        import pyverbs.pd as pd
        import pyverbs.qp as qp
        import pyverbs.wr as wr
        from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError

        self.ce: Any = ce
        self.cmid: Any = cmid
        self.cq: Any = cq
        self.device: Any = device
        self.e: Any = e
        self.mr: Any = mr
        self.pd: Any = pd
        self.qp: Any = qp
        self.wr: Any = wr
        self.error: type[Exception] = PyverbsError
        self.rdma_error: type[Exception] = PyverbsRDMAError


def _errno_of(exc: BaseException) -> int:
    code = getattr(exc, "error_code", 0)
    return code if isinstance(code, int) and code > 0 else 0


@contextlib.contextmanager
def _wrapped(pv: _Pv, what: str) -> Iterator[None]:
    try:
        yield
    except pv.error as exc:
        raise VerbsError(f"{what}: {exc}", _errno_of(exc)) from exc
    except OSError as exc:
        raise VerbsError(f"{what}: {exc}", exc.errno or 0) from exc


class PyverbsVerbs:
    """:class:`~.verbs.Verbs` over pyverbs."""

    def __init__(self) -> None:
        self.pv = _Pv()

    def create_channel(self) -> PvChannel:
        return PvChannel(self.pv)

    def addr_device(self, addr: str) -> str | None:
        """rds_ib_laddr_check: bind a fresh id to ``addr`` (port 0); the device it lands on, if an IB CA.
        Only ever a specific address: a wildcard bind leaves the id without a device, which pyverbs 44
        dereferences (rds-ib-facts.md 5.2); rdma_bind_addr fails (ENODEV) for an address without one."""
        pv = self.pv
        try:
            ch = pv.cmid.CMEventChannel()
        except pv.error:
            return None
        try:
            cmid = pv.cmid.CMID(creator=ch, port_space=pv.ce.RDMA_PS_TCP)
            try:
                ai = pv.cmid.AddrInfo(
                    src=addr, src_service="0", port_space=pv.ce.RDMA_PS_TCP, flags=pv.ce.RAI_PASSIVE
                )
                cmid.bind_addr(ai)
                dev = str(cmid.dev_name)
            finally:
                cmid.close()
        except (pv.error, OSError, ValueError):
            return None
        finally:
            with contextlib.suppress(Exception):
                ch.close()
        return dev if _is_ib_ca(dev) else None


class PvChannel:
    def __init__(self, pv: _Pv) -> None:
        self.pv = pv
        self.listen_id: Any = None
        before = _fd_links()
        with _wrapped(pv, "rdma_create_event_channel"):
            self._ch: Any = pv.cmid.CMEventChannel()
        try:
            self._fd = find_new_fd(before, _fd_links(), _CM_DEV)
            os.set_blocking(self._fd, False)
        except (VerbsError, OSError):
            self._ch.close()
            raise

    def fileno(self) -> int:
        return self._fd

    def create_id(self) -> PvId:
        with _wrapped(self.pv, "rdma_create_id"):
            cmid = self.pv.cmid.CMID(creator=self._ch, port_space=self.pv.ce.RDMA_PS_TCP)
        return PvId(self, cmid)

    def get_event(self) -> CmEvent | None:
        pv = self.pv
        try:
            ev = pv.cmid.CMEvent(self._ch)
        except pv.rdma_error as exc:
            if _errno_of(exc) in (errno.EAGAIN, errno.EWOULDBLOCK):
                return None
            raise VerbsError(f"rdma_get_cm_event: {exc}", _errno_of(exc)) from exc
        except pv.error as exc:
            raise VerbsError(f"rdma_get_cm_event: {exc}") from exc
        try:
            raw = int(ev.event_type)
            kind = CmEventKind.of(raw)
            data = bytes(ev.private_data) if kind in _EVENTS_WITH_DATA else b""
            request: PvId | None = None
            if kind == CmEventKind.CONNECT_REQUEST:
                if self.listen_id is None:
                    raise VerbsError("connect request on a channel without a listener")
                with _wrapped(pv, "CMID from request"):
                    request = PvId(self, pv.cmid.CMID(creator=ev, listen_id=self.listen_id))
        finally:
            with _wrapped(pv, "rdma_ack_cm_event"):
                ev.ack_cm_event()
        return CmEvent(kind, data, request, raw)

    def close(self) -> None:
        with _wrapped(self.pv, "rdma_destroy_event_channel"):
            self._ch.close()


class PvId:
    def __init__(self, channel: PvChannel, cmid: Any) -> None:
        self.channel = channel
        self.pv = channel.pv
        self._id: Any = cmid
        self._qp: PvQueuePair | None = None

    def resolve_addr(self, src: str, dst: str, port: int, timeout_ms: int) -> None:
        pv = self.pv
        with _wrapped(pv, "rdma_resolve_addr"):
            ai = pv.cmid.AddrInfo(src=src, dst=dst, dst_service=str(port), port_space=pv.ce.RDMA_PS_TCP)
            self._id.resolve_addr(ai, timeout_ms)

    def resolve_route(self, timeout_ms: int) -> None:
        with _wrapped(self.pv, "rdma_resolve_route"):
            self._id.resolve_route(timeout_ms)

    def listen(self, addr: str, port: int, backlog: int) -> None:
        pv = self.pv
        with _wrapped(pv, "rdma_bind_addr/listen"):
            ai = pv.cmid.AddrInfo(
                src=addr, src_service=str(port), port_space=pv.ce.RDMA_PS_TCP, flags=pv.ce.RAI_PASSIVE
            )
            self._id.bind_addr(ai)
            self._id.listen(backlog)
        self.channel.listen_id = self._id

    def create_qp(self, config: QpConfig) -> PvQueuePair:
        with _wrapped(self.pv, "device name"):
            dev = str(self._id.dev_name)
        self._qp = PvQueuePair(self.pv, self._id, dev, config)
        return self._qp

    def _conn_param(self, params: ConnParams, qp_num: int) -> Any:
        cp = self.pv.cmid.ConnParam(
            resources=params.responder_resources,
            depth=params.initiator_depth,
            retry=params.retry,
            rnr_retry=params.rnr_retry,
            qp_num=qp_num,
            data_len=len(params.private_data),
        )
        cp.set_private_data(params.private_data)
        return cp

    def _qp_num(self) -> int:
        if self._qp is None:
            raise VerbsError("connect/accept before create_qp")
        return self._qp.qp_num

    def connect(self, params: ConnParams) -> None:
        with _wrapped(self.pv, "rdma_connect"):
            self._id.connect(self._conn_param(params, self._qp_num()))

    def accept(self, params: ConnParams) -> None:
        with _wrapped(self.pv, "rdma_accept"):
            self._id.accept(self._conn_param(params, self._qp_num()))

    def reject(self, data: bytes) -> None:
        with _wrapped(self.pv, "rdma_reject"):
            self._id.reject(data)

    def establish(self) -> None:
        with _wrapped(self.pv, "rdma_establish"):
            self._id.establish()

    def disconnect(self) -> None:
        with _wrapped(self.pv, "rdma_disconnect"):
            self._id.disconnect()

    def close(self) -> None:
        with _wrapped(self.pv, "rdma_destroy_id"):
            self._id.close()


class _IbvMr(ctypes.Structure):
    _fields_ = (
        ("context", ctypes.c_void_p),
        ("pd", ctypes.c_void_p),
        ("addr", ctypes.c_void_p),
        ("length", ctypes.c_size_t),
        ("handle", ctypes.c_uint32),
        ("lkey", ctypes.c_uint32),
        ("rkey", ctypes.c_uint32),
    )


_ibv: Any = None


def _libibverbs() -> Any:
    global _ibv
    if _ibv is None:
        lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
        lib.ibv_import_device.restype = ctypes.c_void_p
        lib.ibv_import_device.argtypes = (ctypes.c_int,)
        lib.ibv_import_pd.restype = ctypes.c_void_p
        lib.ibv_import_pd.argtypes = (ctypes.c_void_p, ctypes.c_uint32)
        lib.ibv_unimport_pd.restype = None
        lib.ibv_unimport_pd.argtypes = (ctypes.c_void_p,)
        lib.ibv_close_device.restype = ctypes.c_int
        lib.ibv_close_device.argtypes = (ctypes.c_void_p,)
        lib.ibv_reg_mr_iova2.restype = ctypes.POINTER(_IbvMr)
        lib.ibv_reg_mr_iova2.argtypes = (
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint64,
            ctypes.c_uint,
        )
        lib.ibv_dereg_mr.restype = ctypes.c_int
        lib.ibv_dereg_mr.argtypes = (ctypes.POINTER(_IbvMr),)
        _ibv = lib
    return _ibv


def _safe_read(addr: int, length: int) -> bytes | None:
    """``length`` bytes of our own memory at ``addr``, or None where nothing is mapped (process_vm_readv on
    ourselves: a wrong guess is an error, never a crash)."""
    from pyrds.userspace.stack.errors import StackError
    from pyrds.userspace.stack.memory import own_memory

    if addr < 4096 or addr & 7:
        return None
    try:
        return own_memory().read(addr, length)
    except StackError:
        return None


def _words(obj: Any) -> list[int]:
    """The pointer-sized words of a Python object's own memory (its C struct: ``sys.getsizeof`` bytes)."""
    raw = ctypes.string_at(id(obj), sys.getsizeof(obj))
    return [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw) - 7, 8)]


def _pd_pointer(pd: Any, ctx: Any, handle: int) -> int:
    """The ``struct ibv_pd *`` a pyverbs ``PD`` wraps (pyverbs keeps it in a C field it never exposes): the
    word of the PD object that points at an ``ibv_pd`` whose ``handle`` is the PD's and whose ``context``
    is a pointer the pyverbs ``Context`` object holds too (``struct ibv_pd { struct ibv_context *context;
    uint32_t handle; }``). 0 when not found."""
    ctx_words = set(_words(ctx))
    for word in _words(pd):
        raw = _safe_read(word, 12)
        if raw is None:
            continue
        context = int.from_bytes(raw[:8], "little")
        if int.from_bytes(raw[8:12], "little") == handle and context and context in ctx_words:
            return word
    return 0


class _ZeroBasedRegion:
    """A buffer we mmap, registered for remote read/write at iova 0 in the QP's PD (see the docstring)."""

    def __init__(self, pd: int, length: int, access: int) -> None:
        lib = _libibverbs()
        self._buf: mmap.mmap | None = mmap.mmap(-1, length)
        self._anchor: Any = ctypes.c_char.from_buffer(self._buf)
        self.length = length
        mr = lib.ibv_reg_mr_iova2(pd, ctypes.addressof(self._anchor), length, 0, access)
        if not mr:
            err = ctypes.get_errno()
            self._release()
            raise VerbsError(f"ibv_reg_mr_iova2 of {length} bytes: {os.strerror(err)}", err)
        self._mr: Any = mr
        self.key = int(mr.contents.rkey)

    def _check(self, offset: int, length: int) -> mmap.mmap:
        if self._buf is None or offset < 0 or length < 0 or offset + length > self.length:
            raise VerbsError(f"region access {offset}+{length} outside {self.length} bytes (or closed)")
        return self._buf

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self._check(offset, length)[offset : offset + length])

    def write(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data))[offset : offset + len(data)] = data

    def _release(self) -> None:
        self._anchor = None
        if self._buf is not None:
            self._buf.close()
            self._buf = None

    def close(self) -> None:
        if self._mr is not None:
            _libibverbs().ibv_dereg_mr(self._mr)
            self._mr = None
        self._release()


class _PvRegion:
    """A pyverbs ``MR`` (local access): an RDMA op's bounce buffer; keeps its work request alive."""

    def __init__(self, mr: Any) -> None:
        self.mr = mr
        self.key = int(mr.rkey)
        self.keep: list[Any] = []

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.mr.read(length, offset))

    def write(self, offset: int, data: bytes) -> None:
        if data:
            self.mr.write(data, len(data), offset)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.mr.close()


class PvQueuePair:
    """Context + PD + completion channel + one CQ + RC QP + send/receive MRs and prebuilt work requests."""

    def __init__(self, pv: _Pv, cmid: Any, dev: str, config: QpConfig) -> None:
        self.pv = pv
        self._cmid = cmid
        self.config = config
        self._closers: list[Callable[[], None]] = []
        e = pv.e
        try:
            with _wrapped(pv, f"open {dev}"):
                self.ctx: Any = pv.device.Context(name=dev)
                self._closers.append(self.ctx.close)
                self.pd: Any = pv.pd.PD(self.ctx)
                self._closers.append(self.pd.close)
                before = _fd_links()
                self.cc: Any = pv.cq.CompChannel(self.ctx)
                self._closers.append(self.cc.close)
            self._fd = find_new_fd(before, _fd_links(), _CQ_EVENT_LINK)
            os.set_blocking(self._fd, False)
            buf = config.recv_buf_size
            with _wrapped(pv, "create CQ/QP/MR"):
                self.cq: Any = pv.cq.CQ(self.ctx, config.send_slots + config.recv_slots + 1, None, self.cc, 0)
                self._closers.append(self.cq.close)
                cap = pv.qp.QPCap(
                    max_send_wr=config.send_slots,
                    max_recv_wr=config.recv_slots,
                    max_send_sge=1,
                    max_recv_sge=2,
                    max_inline_data=0,
                )
                init = pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
                self.qp: Any = pv.qp.QP(self.pd, init)
                self._closers.append(self.qp.close)
                access = e.IBV_ACCESS_LOCAL_WRITE
                self.send_mr: Any = pv.mr.MR(self.pd, config.send_slots * buf, access)
                self._closers.append(self.send_mr.close)
                self.recv_mr: Any = pv.mr.MR(self.pd, config.recv_slots * buf, access)
                self._closers.append(self.recv_mr.close)
                self._build_wrs()
                self.cq.req_notify(False)
        except BaseException:
            self.close()
            raise

    def _build_wrs(self) -> None:
        pv, buf = self.pv, self.config.recv_buf_size
        lkey = int(self.recv_mr.lkey)
        base = int(self.recv_mr.buf)
        self._recv_wrs: list[Any] = []
        self._keep: list[Any] = []
        for slot in range(self.config.recv_slots):
            addr = base + slot * buf
            sges = [
                pv.wr.SGE(addr, RDS_HEADER_SIZE, lkey),
                pv.wr.SGE(addr + RDS_HEADER_SIZE, buf - RDS_HEADER_SIZE, lkey),
            ]
            self._keep.append(sges)
            self._recv_wrs.append(pv.wr.RecvWR(wr_id=slot, num_sge=2, sg=sges))
        lkey = int(self.send_mr.lkey)
        base = int(self.send_mr.buf)
        self._send_sges: list[Any] = []
        self._send_wrs: list[Any] = []
        for slot in range(self.config.send_slots):
            sge = pv.wr.SGE(base + slot * buf, 0, lkey)
            wr = pv.wr.SendWR(wr_id=0, opcode=pv.e.IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=0)
            wr.sg_list = sge
            self._send_sges.append(sge)
            self._send_wrs.append(wr)

    @property
    def qp_num(self) -> int:
        return int(self.qp.qp_num)

    def fileno(self) -> int:
        return self._fd

    def _modify_via_cm(self, state: Any) -> Any:
        attr, mask = self._cmid.init_qp_attr(state)
        self.qp.modify(attr, mask)
        return attr

    def to_init(self) -> None:
        """RESET -> INIT with rdma_cm's attributes, plus remote read/write access (rdma_cm gives an active id
        no access flags before the REP: RDMA into our regions would fail with a remote access error)."""
        e = self.pv.e
        with _wrapped(self.pv, "QP to INIT"):
            attr, mask = self._cmid.init_qp_attr(e.IBV_QPS_INIT)
            attr.qp_access_flags = (
                int(attr.qp_access_flags or 0)
                | e.IBV_ACCESS_LOCAL_WRITE
                | e.IBV_ACCESS_REMOTE_WRITE
                | e.IBV_ACCESS_REMOTE_READ
                | e.IBV_ACCESS_REMOTE_ATOMIC
            )
            self.qp.modify(attr, mask | e.IBV_QP_ACCESS_FLAGS)

    def _import_pd(self) -> int:
        """The QP's ``struct ibv_pd *`` for libibverbs (see the module docstring): found in the pyverbs
        ``PD`` object, else (a provider that can) imported into a second context on a dup of the command
        fd."""
        pd = getattr(self, "_zb_pd", None)
        if pd is not None:
            return int(pd)
        lib = _libibverbs()
        self._zb_regions: list[_ZeroBasedRegion] = []
        found = _pd_pointer(self.pd, self.ctx, int(self.pd.handle))
        if found:
            self._zb_pd = found

            def release_found() -> None:
                for region in self._zb_regions:
                    region.close()

            self._closers.append(release_found)
            return found
        fd = os.dup(int(self.ctx.cmd_fd))
        ctx = lib.ibv_import_device(fd)
        if not ctx:
            err = ctypes.get_errno()
            os.close(fd)
            raise VerbsError(f"no ibv_pd pointer found; ibv_import_device: {os.strerror(err)}", err)
        imported = lib.ibv_import_pd(ctx, int(self.pd.handle))
        if not imported:
            err = ctypes.get_errno()
            lib.ibv_close_device(ctx)
            raise VerbsError(f"ibv_import_pd: {os.strerror(err)}", err)
        self._zb_pd = imported

        def release() -> None:
            for region in self._zb_regions:
                region.close()
            lib.ibv_unimport_pd(imported)
            lib.ibv_close_device(ctx)  # closes the dup

        self._closers.append(release)
        return int(imported)

    def reg_mr(self, length: int, remote: bool) -> _ZeroBasedRegion | _PvRegion:
        e = self.pv.e
        if length <= 0:
            raise VerbsError(f"region of {length} bytes")
        if remote:
            access = (
                e.IBV_ACCESS_LOCAL_WRITE
                | e.IBV_ACCESS_REMOTE_WRITE
                | e.IBV_ACCESS_REMOTE_READ
                | e.IBV_ACCESS_REMOTE_ATOMIC
            )
            region = _ZeroBasedRegion(self._import_pd(), length, int(access))
            self._zb_regions.append(region)
            return region
        with _wrapped(self.pv, "ibv_reg_mr"):
            return _PvRegion(self.pv.mr.MR(self.pd, length, e.IBV_ACCESS_LOCAL_WRITE))

    def post_rdma(
        self, wr_id: int, write: bool, local: Any, length: int, rkey: int, remote_addr: int, fence: bool
    ) -> None:
        pv, e = self.pv, self.pv.e
        if not isinstance(local, _PvRegion):
            raise VerbsError("RDMA from a region that is not a local bounce buffer")
        flags = e.IBV_SEND_SIGNALED | (e.IBV_SEND_FENCE if fence else 0)
        with _wrapped(pv, "ibv_post_send (RDMA)"):
            sge = pv.wr.SGE(int(local.mr.buf), length, int(local.mr.lkey))
            opcode = e.IBV_WR_RDMA_WRITE if write else e.IBV_WR_RDMA_READ
            wr = pv.wr.SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge], send_flags=flags)
            wr.set_wr_rdma(rkey, remote_addr)
            local.keep.extend((sge, wr))
            self.qp.post_send(wr)

    def post_atomic(
        self,
        wr_id: int,
        fetch_add: bool,
        local: Any,
        rkey: int,
        remote_addr: int,
        compare_add: int,
        swap: int,
        fence: bool,
    ) -> None:
        pv, e = self.pv, self.pv.e
        if not isinstance(local, _PvRegion):
            raise VerbsError("an atomic into a region that is not a local bounce buffer")
        flags = e.IBV_SEND_SIGNALED | (e.IBV_SEND_FENCE if fence else 0)
        with _wrapped(pv, "ibv_post_send (atomic)"):
            sge = pv.wr.SGE(int(local.mr.buf), 8, int(local.mr.lkey))
            opcode = e.IBV_WR_ATOMIC_FETCH_AND_ADD if fetch_add else e.IBV_WR_ATOMIC_CMP_AND_SWP
            wr = pv.wr.SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge], send_flags=flags)
            wr.set_wr_atomic(rkey, remote_addr, compare_add, swap)
            local.keep.extend((sge, wr))
            self.qp.post_send(wr)

    def to_rts(self) -> None:
        with _wrapped(self.pv, "QP to RTR/RTS"):
            self._rtr_attr = self._modify_via_cm(self.pv.e.IBV_QPS_RTR)
            self._modify_via_cm(self.pv.e.IBV_QPS_RTS)

    def gids(self) -> tuple[bytes, bytes]:
        """From the RTR attributes rdma_cm gave (``rdma_init_qp_attr``: the path's address vector): the
        destination GID, and the source GID at its ``sgid_index`` in the port's table. Zeros for what cannot
        be read (never raises: the GIDs are only shown in RDS_INFO_IB_CONNECTIONS)."""
        zero = bytes(16)
        ah = getattr(getattr(self, "_rtr_attr", None), "ah_attr", None)
        if ah is None:
            return zero, zero
        try:
            dst = _gid_bytes(ah.dgid)
            src = _gid_bytes(self.ctx.query_gid(int(ah.port_num), int(ah.sgid_index or 0)))
        except Exception:  # whatever pyverbs raises, the table shows zeros
            return zero, zero
        return src, dst

    @property
    def device_max_sge(self) -> int:
        try:
            return int(self.ctx.query_device().max_sge)
        except Exception:  # unknown: 0
            return 0

    def to_error(self) -> None:
        e = self.pv.e
        with _wrapped(self.pv, "QP to ERR"):
            self.qp.modify(self.pv.qp.QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)

    def post_recv(self, slot: int) -> None:
        with _wrapped(self.pv, "ibv_post_recv"):
            self.qp.post_recv(self._recv_wrs[slot])

    def post_send(self, slot: int, wr_id: int, data: bytes, signaled: bool, solicited: bool) -> None:
        buf = self.config.recv_buf_size
        if not 0 <= slot < self.config.send_slots or len(data) > buf:
            raise VerbsError(f"send of {len(data)} bytes in slot {slot}")
        e = self.pv.e
        flags = (e.IBV_SEND_SIGNALED if signaled else 0) | (e.IBV_SEND_SOLICITED if solicited else 0)
        with _wrapped(self.pv, "ibv_post_send"):
            if data:
                self.send_mr.write(data, len(data), slot * buf)
            self._send_sges[slot].length = len(data)
            wr = self._send_wrs[slot]
            wr.wr_id = wr_id
            wr.send_flags = flags
            self.qp.post_send(wr)

    def read_recv(self, slot: int, length: int) -> bytes:
        buf = self.config.recv_buf_size
        if not 0 <= slot < self.config.recv_slots or not 0 <= length <= buf:
            raise VerbsError(f"read of {length} bytes from slot {slot}")
        with _wrapped(self.pv, "MR read"):
            return bytes(self.recv_mr.read(length, slot * buf))

    def completions(self) -> list[Completion]:
        pv = self.pv
        try:
            self.cc.get_cq_event(self.cq)
        except pv.rdma_error as exc:
            if _errno_of(exc) not in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise VerbsError(f"ibv_get_cq_event: {exc}", _errno_of(exc)) from exc
        else:
            with _wrapped(pv, "ibv_ack_cq_events"):
                self.cq.ack_events(1)
        out: list[Completion] = []
        with _wrapped(pv, "ibv_poll_cq"):
            self.cq.req_notify(False)
            while True:
                n, wcs = self.cq.poll(_POLL_BATCH)
                for wc in wcs:
                    out.append(Completion(int(wc.wr_id), int(wc.status), int(wc.opcode), int(wc.byte_len)))
                if int(n) < _POLL_BATCH:
                    break
        return out

    def close(self) -> None:
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()
