"""RDMA on an RDS socket of an RDMA transport (net/rds/rdma.c, the cmsg parts of send.c and recv.c), sans-IO.

What a socket of RDS/IB may put in a sendmsg, checked in the kernel's order and with its errnos:

- :func:`rm_size` is ``rds_rm_size`` + ``rds_rdma_extra_size``: every SOL_RDS cmsg type known (else EINVAL),
  an RDMA_ARGS' ``rds_iovec`` array read from the client (``nr_local`` 0 -> EINVAL, > UIO_MAXIOV -> EMSGSIZE,
  unreadable -> EFAULT, an empty or wrapping vector -> EINVAL), (DEST, MAP) never with (ARGS, atomics).
- :func:`cmsg_send` is ``rds_cmsg_send``: RDMA_ARGS (``rds_cmsg_rdma_args``), RDMA_DEST
  (``rds_cmsg_rdma_dest``: the socket's MR of that r_key, else EINVAL), RDMA_MAP (``rds_cmsg_rdma_map``:
  ``__rds_rdma_map``, the cookie written to the client's cookie address), in cmsg order, each at most once.
  A failure after an MR was made frees it (``rds_rdma_unuse(force)`` at the end of ``rds_sendmsg``).

The registered memory is the transport's (:class:`Region`: a buffer the service owns, registered with the
device); the client's memory is reached through :class:`~pyrds.userspace.stack.memory.ClientMemory`. An MR
covers whole pages, as the kernel pins them: [addr & ~4095, round_up(addr + bytes)); the cookie is
``r_key | (addr & 4095) << 32`` (``rds_rdma_make_cookie``: the r_key in the low half) and remote addresses
are offsets into the registered pages (the kernel's FRWR MRs are zero-based). The region gets the client's
pages when it is mapped and again whenever the socket names it in an RDMA_DEST (the kernel's
``sync_mr(DMA_TO_DEVICE)``); what the peer wrote into it goes back to the client when a message carrying the
RDMA extension header for its r_key arrives (``rds_rdma_unuse`` -> ``sync_mr(DMA_FROM_DEVICE)``), only the
bytes that differ from what the region held (:func:`changed_runs`), so the client's own writes elsewhere in
those pages are kept.

Atomics (``rds_cmsg_atomic``: :func:`_atomic_op`) go out as plain verbs atomics; the masked types, which
neither verbs nor rdma_rxe have, are done with plain ones by :class:`MaskedAtomic` (a read, then
compare-and-swaps computed with :func:`masked_fadd` / :func:`masked_cswp`), sans-IO; the IB driver posts the
steps.
"""

from __future__ import annotations

import contextlib
import errno
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pyrds.constants import SOL_RDS, CmsgType, RdmaFlag, RdmaStatus
from pyrds.userspace.stack.ancillary import ATOMIC_ARGS_SIZE, ATOMICS, RDMA_ARGS_SIZE, scan_cmsgs
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.memory import MAX_ACCESS, ClientMemory

__all__ = [
    "ATOMIC_ARGS_SIZE",
    "ATOMIC_CSWP",
    "ATOMIC_FADD",
    "AtomicStep",
    "GET_MR_ARGS_SIZE",
    "MAX_MASKED_SWAPS",
    "MaskedAtomic",
    "RDMA_ARGS_SIZE",
    "NOT_ATOMIC",
    "MemRegion",
    "Plan",
    "READ_STEP",
    "RdmaOp",
    "Region",
    "changed_runs",
    "cmsg_send",
    "masked_cswp",
    "masked_fadd",
    "map_checks",
    "rm_size",
]

PAGE = 4096
UIO_MAXIOV = 1024
RDS_MAX_MSG_SIZE = 1 << 20
GET_MR_ARGS_SIZE = 32
#: MRs per socket and bytes of local RDMA per op: our bounds (the kernel's are memlock and its MR pools)
MAX_MRS_PER_SOCKET = 256
MAX_OP_BYTES = MAX_ACCESS
_U64 = (1 << 64) - 1


class Region(Protocol):
    """Memory a transport registered for remote access (``rds_ib_mr``): ``key`` is its r_key."""

    @property
    def key(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...
    def write(self, offset: int, data: bytes) -> None: ...
    def close(self) -> None: ...


#: ``get_mr(length) -> Region``; raises StackError (EAGAIN: the connection is not up yet)
GetMr = Callable[[int], Region]


class RegionGone(StackError):
    """The transport's registration of an MR is gone (its connection's queue pair was destroyed: our MRs
    live as long as the QP they were registered on); the MR is then forgotten, and naming it is EINVAL."""

    def __init__(self) -> None:
        super().__init__(errno.EINVAL)


def _region_io(fn: Callable[[], bytes | None]) -> bytes | None:
    try:
        return fn()
    except StackError:
        raise
    except Exception as exc:  # the transport's error (VerbsError), or a closed buffer
        raise RegionGone() from exc


@dataclass(slots=True)
class MemRegion:
    """``struct rds_mr``: one of a socket's MRs."""

    key: int
    base: int  # client address of the first registered page
    length: int  # whole pages
    region: Region
    use_once: bool = False
    invalidate: bool = False
    write: bool = False
    #: the region's content as last synced from the client (what changed since is the peer's)
    shadow: bytes = b""

    def sync_to_device(self, mem: ClientMemory) -> None:
        """The client's pages into the region (EFAULT if they are gone)."""
        data = mem.read(self.base, self.length)
        _region_io(lambda: self.region.write(0, data))
        self.shadow = data

    def sync_from_device(self, mem: ClientMemory) -> int:
        """What the peer changed in the region back into the client's pages; returns the bytes written."""
        now = _region_io(lambda: self.region.read(0, self.length)) or b""
        n = 0
        for start, end in changed_runs(self.shadow, now):
            mem.write(self.base + start, now[start:end])
            n += end - start
        self.shadow = now
        return n


#: :attr:`RdmaOp.atomic`: not an atomic (an RDMA READ or WRITE), fetch-and-add, compare-and-swap
NOT_ATOMIC, ATOMIC_FADD, ATOMIC_CSWP = 0, 1, 2
_ALL_ONES = _U64


@dataclass(slots=True)
class RdmaOp:
    """``struct rm_rdma_op`` (an RDMA READ or WRITE) or ``struct rm_atomic_op`` (:attr:`atomic` set: an
    8-byte fetch-and-add or compare-and-swap whose original remote value lands in the one local vector, as
    a READ's bytes do), going out before its message."""

    write: bool
    rkey: int
    remote_addr: int
    nbytes: int
    local: list[tuple[int, int]]  # the client's (addr, bytes) vectors
    data: bytes = b""  # WRITE: the local bytes, read from the client when the message was sent
    fence: bool = False
    notify: bool = False
    silent: bool = False
    recverr: bool = False
    token: int = 0
    sock_id: int = 0
    #: the notification went out already (never a second one for the op)
    done: bool = False
    atomic: int = NOT_ATOMIC
    compare_add: int = 0  # FADD: the addend; CSWP: the compare value
    swap: int = 0  # CSWP: the swap value
    nocarry_mask: int = 0  # masked FADD: a set bit i stops the carry out of bit i
    compare_mask: int = _ALL_ONES  # masked CSWP: the bits compared
    swap_mask: int = _ALL_ONES  # masked CSWP: the bits swapped

    @property
    def masked(self) -> bool:
        """An atomic whose masks are not the plain op's: done with plain atomics (:class:`MaskedAtomic`)."""
        if self.atomic == ATOMIC_FADD:
            return self.nocarry_mask != 0
        if self.atomic == ATOMIC_CSWP:
            return self.compare_mask != _ALL_ONES or self.swap_mask != _ALL_ONES
        return False


@dataclass(slots=True)
class Plan:
    """What :func:`rm_size` found: RDMA_ARGS' vectors (in cmsg order), the zerocopy cookie."""

    vectors: list[list[tuple[int, int]]] = field(default_factory=list)
    zcookie: int | None = None
    any_rdma: bool = False


def _pages(addr: int, nbytes: int) -> int:
    """``rds_pages_in_vec``: 0 for an empty, wrapping or over-4-GiB vector."""
    if addr + nbytes <= addr or nbytes > 0xFFFFFFFF or addr + nbytes > _U64:
        return 0
    return ((addr + nbytes + PAGE - 1) >> 12) - (addr >> 12)


def _rdma_args(data: bytes) -> tuple[int, int, int, int, int, int, int]:
    """(cookie, remote addr, remote bytes, local_vec_addr, nr_local, flags, user_token)"""
    return struct.unpack_from("=QQQQQQQ", data)


def rm_size(anc: Sequence[tuple[int, int, bytes]], flags: int, zcopy: bool, mem: ClientMemory) -> Plan:
    """``rds_rm_size`` for a socket of an RDMA transport (see the module docstring)."""
    plan = Plan()

    def size_vectors(data: bytes) -> None:
        _c, _ra, _rb, vec_addr, nr_local, _f, _t = _rdma_args(data)
        if nr_local == 0:
            raise StackError(errno.EINVAL)
        if nr_local > UIO_MAXIOV:
            raise StackError(errno.EMSGSIZE)
        raw = mem.read(vec_addr, nr_local * 16)
        vecs = [struct.unpack_from("=QQ", raw, 16 * i) for i in range(nr_local)]
        for addr, nbytes in vecs:
            if _pages(addr, nbytes) == 0:
                raise StackError(errno.EINVAL)
        plan.vectors.append([(int(a), int(b)) for a, b in vecs])

    plan.any_rdma = scan_cmsgs(anc, flags, size_vectors)
    del zcopy  # MSG_ZEROCOPY on IB failed before (EOPNOTSUPP)
    return plan


def map_checks(addr: int, nbytes: int) -> int:
    """``__rds_rdma_map``'s argument checks after the transport's: the number of pages, or EINVAL (address
    overflow, nothing to map) / EMSGSIZE (more than RDS_MAX_MSG_SIZE plus a page)."""
    end = addr + nbytes
    if end > _U64 or ((end + PAGE - 1) & ~(PAGE - 1)) > _U64:
        raise StackError(errno.EINVAL)
    n = _pages(addr, nbytes)
    if n == 0:
        raise StackError(errno.EINVAL)
    if n - 1 > RDS_MAX_MSG_SIZE >> 12:
        raise StackError(errno.EMSGSIZE)
    return n


def make_mr(
    addr: int, nbytes: int, flags: int, mem: ClientMemory, get_mr: GetMr, mrs: dict[int, MemRegion]
) -> MemRegion:
    """``__rds_rdma_map`` from its size checks on: pin (read the client's pages: EFAULT), register
    (``get_mr``), remember. The caller writes the cookie and inserts the MR."""
    npages = map_checks(addr, nbytes)
    if len(mrs) >= MAX_MRS_PER_SOCKET:
        raise StackError(errno.ENOMEM)
    base = addr & ~(PAGE - 1)
    length = npages * PAGE
    data = mem.read(base, length)
    region = get_mr(length)
    try:
        _region_io(lambda: region.write(0, data))
    except StackError:
        region.close()
        raise
    return MemRegion(
        region.key,
        base,
        length,
        region,
        use_once=bool(flags & RdmaFlag.USE_ONCE),
        invalidate=bool(flags & RdmaFlag.INVALIDATE),
        write=bool(flags & RdmaFlag.READWRITE),
        shadow=data,
    )


@dataclass(slots=True)
class SendResult:
    """What ``rds_cmsg_send`` put in the message."""

    op: RdmaOp | None = None
    cookie: int = 0  # m_rdma_cookie: goes to the peer as RDS_EXTHDR_RDMA_DEST
    new_mr: MemRegion | None = None  # made by this send's RDMA_MAP (freed if the send fails later)


def cmsg_send(
    anc: Sequence[tuple[int, int, bytes]],
    plan: Plan,
    *,
    sock_id: int,
    recverr: bool,
    mem: ClientMemory,
    mrs: dict[int, MemRegion],
    get_mr: GetMr,
) -> SendResult:
    """``rds_cmsg_send`` (see the module docstring). Atomics: :func:`_atomic_op`. A message carries one op:
    an RDMA_ARGS and an atomic together are EOPNOTSUPP (the kernel posts both)."""
    res = SendResult()
    vec_index = 0
    try:
        for level, kind, data in anc:
            if level != SOL_RDS:
                continue
            if kind == CmsgType.RDS_CMSG_RDMA_ARGS:
                if res.op is not None and not res.op.atomic:
                    raise StackError(errno.EINVAL)
                if res.op is not None:
                    raise StackError(errno.EOPNOTSUPP)  # an atomic came first: one op per message here
                res.op = _rdma_op(data, plan.vectors[vec_index], sock_id, recverr, mem)
                vec_index += 1
            elif kind == CmsgType.RDS_CMSG_RDMA_DEST:
                if len(data) < 8 or res.cookie:
                    raise StackError(errno.EINVAL)
                (cookie,) = struct.unpack_from("=Q", data)
                res.cookie = cookie
                mr = mrs.get(cookie & 0xFFFFFFFF)
                if mr is None:
                    raise StackError(errno.EINVAL)
                try:
                    mr.sync_to_device(mem)
                except RegionGone:
                    drop_mr(mrs, mr.key)
                    raise
            elif kind == CmsgType.RDS_CMSG_RDMA_MAP:
                if len(data) < GET_MR_ARGS_SIZE or res.cookie:
                    raise StackError(errno.EINVAL)
                addr, nbytes, cookie_addr, flags = struct.unpack_from("=QQQQ", data)
                mr = make_mr(addr, nbytes, flags, mem, get_mr, mrs)
                cookie = mr.key | (addr & (PAGE - 1)) << 32
                res.cookie = cookie
                if cookie_addr:
                    try:
                        mem.write(cookie_addr, struct.pack("=Q", cookie))
                    except StackError:
                        mr.region.close()
                        raise
                mrs[mr.key] = mr
                res.new_mr = mr
            elif kind in ATOMICS:
                if len(data) < ATOMIC_ARGS_SIZE or (res.op is not None and res.op.atomic):
                    raise StackError(errno.EINVAL)  # rds_cmsg_atomic: short, or a second atomic
                atomic = _atomic_op(kind, data, sock_id, recverr, mem)
                if res.op is not None:
                    # the kernel sends both (the atomic first); one op per message here
                    raise StackError(errno.EOPNOTSUPP)
                res.op = atomic
    except StackError:
        if res.new_mr is not None:
            drop_mr(mrs, res.new_mr.key)
        raise
    return res


def _remote(cookie: int, remote_addr: int) -> tuple[int, int]:
    """(r_key, remote address) of an op: the cookie's key (``rds_rdma_cookie_key``), and ``remote_addr`` plus
    the cookie's offset (``rds_rdma_cookie_offset``), as ``rds_cmsg_rdma_args`` / ``rds_cmsg_atomic``."""
    return cookie & 0xFFFFFFFF, (remote_addr + (cookie >> 32)) & _U64


def _rdma_op(
    data: bytes, vecs: list[tuple[int, int]], sock_id: int, recverr: bool, mem: ClientMemory
) -> RdmaOp:
    """``rds_cmsg_rdma_args``: pin (read) the local vectors, the remote address from the cookie."""
    cookie, raddr, rbytes, _vec_addr, nr_local, flags, token = _rdma_args(data)
    if nr_local > UIO_MAXIOV:
        raise StackError(errno.EMSGSIZE)
    if len(vecs) != nr_local:
        raise StackError(errno.EINVAL)
    write = bool(flags & RdmaFlag.READWRITE)
    nbytes = sum(b for _a, b in vecs)
    if nbytes > MAX_OP_BYTES:
        raise StackError(errno.ENOMEM)  # our bound on what is copied per op (the kernel pins any size)
    chunks = [mem.read(a, b) for a, b in vecs]  # a READ's target must be there too (pinned for writing)
    if nbytes > rbytes:
        raise StackError(errno.EINVAL)
    rkey, remote = _remote(cookie, raddr)
    return RdmaOp(
        write=write,
        rkey=rkey,
        remote_addr=remote,
        nbytes=nbytes,
        local=list(vecs),
        data=b"".join(chunks) if write else b"",
        fence=bool(flags & RdmaFlag.FENCE),
        notify=bool(flags & RdmaFlag.NOTIFY_ME),
        silent=bool(flags & RdmaFlag.SILENT),
        recverr=recverr,
        token=token,
        sock_id=sock_id,
    )


def _atomic_op(kind: int, data: bytes, sock_id: int, recverr: bool, mem: ClientMemory) -> RdmaOp:
    """``rds_cmsg_atomic``: ``struct rds_atomic_args`` (cookie, local_addr, remote_addr, four u64 of the
    op, flags, user_token). The plain types get the masks the kernel gives them (nocarry_mask 0; compare
    and swap masks ~0) and go out as one plain verbs atomic; a masked type keeps its masks and, unless they
    are the plain ones, is emulated with plain atomics (:class:`MaskedAtomic`: the verbs API and rdma_rxe
    have no masked atomics). The local word must be 8-byte aligned (EFAULT) and there (EFAULT); the remote
    address is ``remote_addr`` + the cookie's offset."""
    cookie, local_addr, remote_addr, a, b, c, d, flags, token = struct.unpack_from("=9Q", data)
    nocarry, cmask, smask = 0, _ALL_ONES, _ALL_ONES
    if kind == CmsgType.RDS_CMSG_ATOMIC_FADD:
        atomic, compare_add, swap = ATOMIC_FADD, a, 0
    elif kind == CmsgType.RDS_CMSG_MASKED_ATOMIC_FADD:
        atomic, compare_add, swap, nocarry = ATOMIC_FADD, a, 0, b
    elif kind == CmsgType.RDS_CMSG_ATOMIC_CSWP:
        atomic, compare_add, swap = ATOMIC_CSWP, a, b
    else:  # RDS_CMSG_MASKED_ATOMIC_CSWP: compare, swap, compare_mask, swap_mask
        atomic, compare_add, swap, cmask, smask = ATOMIC_CSWP, a, b, c, d
    if local_addr & 7:
        raise StackError(errno.EFAULT)
    mem.read(local_addr, 8)  # rds_pin_pages: EFAULT when the word is not there
    rkey, remote = _remote(cookie, remote_addr)
    return RdmaOp(
        write=False,
        rkey=rkey,
        remote_addr=remote,
        nbytes=8,
        local=[(local_addr, 8)],
        notify=bool(flags & RdmaFlag.NOTIFY_ME),
        silent=bool(flags & RdmaFlag.SILENT),
        recverr=recverr,
        token=token,
        sock_id=sock_id,
        atomic=atomic,
        compare_add=compare_add,
        swap=swap,
        nocarry_mask=nocarry,
        compare_mask=cmask,
        swap_mask=smask,
    )


# -- masked atomics from plain ones --------------------------------------------------------------------------
#: compare-and-swaps one masked op may post before it gives up (RDS_RDMA_OTHER_ERROR)
MAX_MASKED_SWAPS = 32


def masked_fadd(old: int, add: int, nocarry_mask: int) -> int:
    """InfiniBand's masked fetch-and-add (``IB_WR_MASKED_ATOMIC_FETCH_AND_ADD``, what the kernel posts for
    RDS_CMSG_MASKED_ATOMIC_FADD): ``old + add`` modulo 2^64 where a set bit i of ``nocarry_mask`` stops the
    carry out of bit i, so the word is a row of independent fields, each ending at a set bit. The top bit of
    each field is added without its carry (an exclusive or); the bits below it carry as usual, at most into
    the top bit, which both operands have cleared."""
    old, add, tops = old & _U64, add & _U64, nocarry_mask & _U64
    return (((old & ~tops) + (add & ~tops)) ^ ((old ^ add) & tops)) & _U64


def masked_cswp(old: int, compare: int, swap: int, compare_mask: int, swap_mask: int) -> int:
    """InfiniBand's masked compare-and-swap (``IB_WR_MASKED_ATOMIC_CMP_AND_SWP``): if the bits of
    ``compare_mask`` of ``old`` equal those of ``compare``, the bits of ``swap_mask`` take ``swap``'s, the
    others stay; else the word is unchanged. Returns the new word."""
    old &= _U64
    if (old ^ compare) & compare_mask & _U64:
        return old
    return ((old & ~swap_mask) | (swap & swap_mask)) & _U64


@dataclass(frozen=True, slots=True)
class AtomicStep:
    """One plain verbs atomic to post on the op's word: a fetch-and-add of ``compare_add``, or a
    compare-and-swap of ``compare_add`` (the expected value) for ``swap``."""

    fetch_add: bool
    compare_add: int
    swap: int = 0


#: the read that starts a masked op: a fetch-and-add of 0 returns the word atomically and leaves it
READ_STEP = AtomicStep(True, 0)


class MaskedAtomic:
    """A masked atomic done with plain ones, sans-IO: :meth:`first` is the read (fetch-and-add 0); each
    returned original value goes to :meth:`advance`, which computes the new word locally and asks for a
    compare-and-swap (expected the value read, swap the new word), or says the op is done. A swap that
    returns another value lost a race with another atomic on the word: the next try starts from that value
    (no new read), at most :data:`MAX_MASKED_SWAPS` swaps, then :attr:`status` is RDS_RDMA_OTHER_ERROR.
    When the masked compare fails, or the new word equals the old, the op is done without a write.

    Linearizable against every other atomic on the word (a successful swap took effect on exactly the value
    the result was computed from; a failed compare or a no-op took effect at the atomic read that saw the
    value), not against plain RDMA writes -- as a masked atomic of an HCA is not either. The result is the
    original value, as the masked op's: :attr:`result` (None unless :attr:`status` is SUCCESS)."""

    __slots__ = ("op", "max_swaps", "swaps", "result", "status", "_expected")

    def __init__(self, op: RdmaOp, max_swaps: int = MAX_MASKED_SWAPS) -> None:
        if op.atomic not in (ATOMIC_FADD, ATOMIC_CSWP) or max_swaps < 1:
            raise ValueError("a fetch-and-add or compare-and-swap, and at least one swap")
        self.op = op
        self.max_swaps = max_swaps
        #: compare-and-swaps asked for so far (a retry is every one after the first)
        self.swaps = 0
        self.result: int | None = None
        self.status = int(RdmaStatus.SUCCESS)
        self._expected: int | None = None  # the value the swap in flight expects; None: the read is

    @property
    def retries(self) -> int:
        return max(self.swaps - 1, 0)

    @property
    def done(self) -> bool:
        return self.result is not None or self.status != RdmaStatus.SUCCESS

    def first(self) -> AtomicStep:
        return READ_STEP

    def new_word(self, old: int) -> int:
        op = self.op
        if op.atomic == ATOMIC_FADD:
            return masked_fadd(old, op.compare_add, op.nocarry_mask)
        return masked_cswp(old, op.compare_add, op.swap, op.compare_mask, op.swap_mask)

    def advance(self, returned: int) -> AtomicStep | None:
        """The step in flight completed with ``returned`` (the word's value before it): the next step to
        post, or None when the op is done (:attr:`result`, :attr:`status`)."""
        if self.done:
            raise ValueError("the masked atomic is done")
        returned &= _U64
        if self._expected is not None and returned == self._expected:
            self.result = returned  # the swap took effect
            return None
        new = self.new_word(returned)
        if new == returned:  # the compare failed, or nothing changes: the read (or failed swap) was the op
            self.result = returned
            return None
        if self.swaps >= self.max_swaps:
            self.status = int(RdmaStatus.OTHER_ERROR)
            return None
        self.swaps += 1
        self._expected = returned
        return AtomicStep(False, returned, new)


def drop_mr(mrs: dict[int, MemRegion], key: int) -> MemRegion | None:
    """Forget MR ``key`` and release its registration (``rds_destroy_mr``)."""
    mr = mrs.pop(key, None)
    if mr is not None:
        with contextlib.suppress(Exception):  # a registration its QP took along already
            mr.region.close()
    return mr


def scatter(op: RdmaOp, data: bytes, mem: ClientMemory) -> None:
    """A completed READ: its bytes into the client's local vectors, in order."""
    off = 0
    for addr, nbytes in op.local:
        mem.write(addr, data[off : off + nbytes])
        off += nbytes


def notify_status(wc_ok: bool, remote_access: bool) -> int:
    """``rds_ib_send_complete``'s status for a completion (a flush notifies nothing: the caller's job)."""
    if wc_ok:
        return int(RdmaStatus.SUCCESS)
    return int(RdmaStatus.REMOTE_ERROR if remote_access else RdmaStatus.OTHER_ERROR)


def changed_runs(old: bytes, new: bytes, chunk: int = PAGE) -> Iterator[tuple[int, int]]:
    """[start, end) runs where ``new`` differs from ``old`` (same length), at most one per ``chunk``: from
    the first to the last differing byte of each chunk that changed."""
    for off in range(0, len(new), chunk):
        a, b = old[off : off + chunk], new[off : off + chunk]
        if a == b:
            continue
        x = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
        n = len(b)
        last = n - 1 - ((x & -x).bit_length() - 1) // 8
        first = n - (x.bit_length() + 7) // 8
        yield off + first, off + last + 1
