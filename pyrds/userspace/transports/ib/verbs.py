"""The narrow verbs interface the RDS/IB driver (:mod:`.driver`) talks to: rdma_cm ids and one RC queue pair.

Three objects, each only what the driver needs:

- :class:`CmChannel`: an rdma_cm event channel. Its fd (``fileno``) is non-blocking;
  :meth:`CmChannel.get_event` returns ``None`` when nothing is pending and hands out each event already
  acknowledged (its private data copied, a CONNECT_REQUEST's new id wrapped), so no id is ever kept waiting
  on an unacked event.
- :class:`CmId`: one rdma_cm id (``RDMA_PS_TCP``): resolve, listen, connect / accept / reject / establish,
  disconnect. It creates the connection's :class:`QueuePair` once it is bound to a device.
- :class:`QueuePair`: an *external* RC QP (rds-ib-facts.md 5.3) with one completion queue for sends and
  receives, its non-blocking completion-channel fd, a registered receive ring (``recv_slots`` buffers of
  48 + 4096 bytes, two SGEs each) and a registered send ring (``send_slots`` buffers of up to 48 + 4096 bytes,
  one SGE). Work requests name slots; the driver decides which slot holds what.

:class:`Verbs` makes channels and tells which addresses have an RDMA device. The real implementation is
:mod:`.pyverbs_backend` (imported only when used); the unit tests use a fake. Nothing here imports pyverbs.
Every failure of a verbs call is a :class:`VerbsError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from pyrds.userspace.transports.ib.wire import RECV_BUF_SIZE

__all__ = [
    "CmChannel",
    "CmEvent",
    "CmEventKind",
    "CmId",
    "Completion",
    "MemoryRegion",
    "ConnParams",
    "QpConfig",
    "QueuePair",
    "Verbs",
    "VerbsError",
    "WcOpcode",
    "WcStatus",
]


class VerbsError(Exception):
    """A verbs or rdma_cm call failed; ``errno`` is the error number when the library gave one (else 0)."""

    def __init__(self, msg: str, errno: int = 0) -> None:
        super().__init__(msg)
        self.errno = errno


class CmEventKind(enum.IntEnum):
    """``enum rdma_cm_event_type`` (the ones an RC connection sees); ``OTHER`` for anything else."""

    ADDR_RESOLVED = 0
    ADDR_ERROR = 1
    ROUTE_RESOLVED = 2
    ROUTE_ERROR = 3
    CONNECT_REQUEST = 4
    CONNECT_RESPONSE = 5
    CONNECT_ERROR = 6
    UNREACHABLE = 7
    REJECTED = 8
    ESTABLISHED = 9
    DISCONNECTED = 10
    DEVICE_REMOVAL = 11
    ADDR_CHANGE = 14
    TIMEWAIT_EXIT = 15
    OTHER = -1

    @classmethod
    def of(cls, value: int) -> CmEventKind:
        try:
            return cls(value)
        except ValueError:
            return cls.OTHER


class WcStatus(enum.IntEnum):
    """The ``ibv_wc_status`` values the driver tells apart (any other non-zero value is an error too)."""

    SUCCESS = 0
    WR_FLUSH_ERR = 5
    REM_ACCESS_ERR = 10


class WcOpcode(enum.IntEnum):
    """``ibv_wc_opcode``: SEND for a send completion; RECV (and RECV_RDMA_WITH_IMM) have bit 7 set."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


@dataclass(frozen=True, slots=True)
class Completion:
    """One work completion (the fields of ``ibv_wc`` the driver reads)."""

    wr_id: int
    status: int
    opcode: int
    byte_len: int

    @property
    def is_recv(self) -> bool:
        return bool(self.opcode & WcOpcode.RECV)


@dataclass(frozen=True, slots=True)
class CmEvent:
    """An rdma_cm event, already acknowledged. ``private_data``: the CM message's consumer data (REQ, REP or
    REJ; zero padded by rdma_cm to the whole area). ``request``: for CONNECT_REQUEST, the new id."""

    kind: CmEventKind
    private_data: bytes = b""
    request: CmId | None = None
    #: the raw event type (``kind`` is OTHER for types this module does not name)
    raw: int = -1


@dataclass(frozen=True, slots=True)
class QpConfig:
    """What the driver asks of a queue pair: ring sizes in slots (send includes the ACK slot)."""

    send_slots: int
    recv_slots: int
    recv_buf_size: int = RECV_BUF_SIZE

    def __post_init__(self) -> None:
        if self.send_slots < 1 or self.recv_slots < 1:
            raise ValueError("send_slots and recv_slots must be >= 1")


@dataclass(frozen=True, slots=True)
class ConnParams:
    """``struct rdma_conn_param`` as RDS/IB fills it (ib_cm.c ``rds_ib_cm_fill_conn_param``): the private
    data, rd_atomic limits (at least 1 both ways), retry 7 and RNR retry 7 (infinite: governs the peer's
    QP)."""

    private_data: bytes
    responder_resources: int = 1
    initiator_depth: int = 1
    retry: int = 7
    rnr_retry: int = 7


class MemoryRegion(Protocol):
    """A buffer the service owns, registered in the queue pair's protection domain. ``remote``: remotely
    readable and writable at *zero-based* addresses (offset 0 = the first byte, as the kernel's FRWR MRs);
    otherwise local only (the bounce buffer of an RDMA op). ``key`` is the r_key."""

    @property
    def key(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...
    def write(self, offset: int, data: bytes) -> None: ...

    def close(self) -> None:
        """Deregister and free (idempotent; a no-op once the queue pair is closed)."""


class QueuePair(Protocol):
    """An RC QP with its CQ, completion channel and send/receive rings (see the module docstring)."""

    @property
    def qp_num(self) -> int: ...

    def fileno(self) -> int:
        """The completion channel's fd (non-blocking); readable when a CQ event is pending."""
        ...

    def to_init(self) -> None:
        """RESET -> INIT with the attributes rdma_cm gives (``rdma_init_qp_attr``)."""

    def to_rts(self) -> None:
        """INIT -> RTR -> RTS with the attributes rdma_cm gives (after the REQ/REP exchange)."""

    def to_error(self) -> None:
        """Move to ERR: every posted work request completes with WR_FLUSH_ERR."""

    def gids(self) -> tuple[bytes, bytes]:
        """(source, destination) GID of the connection's path, 16 bytes each, once the QP is RTR or later
        (what ``rdma_read_gids`` gives the kernel; RoCE: the IPv4-mapped addresses); zeros when unknown."""
        ...

    @property
    def device_max_sge(self) -> int:
        """The device's ``max_sge`` (``ibv_device_attr``; 0 when unknown)."""
        ...

    def post_recv(self, slot: int) -> None:
        """Post receive buffer ``slot`` (wr_id = slot): SGE0 48 bytes, SGE1 4096 bytes, contiguous."""

    def post_send(self, slot: int, wr_id: int, data: bytes, signaled: bool, solicited: bool) -> None:
        """Copy ``data`` (at most 48 + 4096 bytes) into send buffer ``slot`` and post one IBV_WR_SEND."""

    def reg_mr(self, length: int, remote: bool) -> MemoryRegion:
        """Register ``length`` bytes of new memory (see :class:`MemoryRegion`)."""
        ...

    def post_rdma(
        self,
        wr_id: int,
        write: bool,
        local: MemoryRegion,
        length: int,
        rkey: int,
        remote_addr: int,
        fence: bool,
    ) -> None:
        """Post one signalled IBV_WR_RDMA_WRITE (``local`` -> peer) or IBV_WR_RDMA_READ (peer -> ``local``) of
        ``length`` bytes at ``remote_addr`` of the peer's region ``rkey``."""

    def post_atomic(
        self,
        wr_id: int,
        fetch_add: bool,
        local: MemoryRegion,
        rkey: int,
        remote_addr: int,
        compare_add: int,
        swap: int,
        fence: bool,
    ) -> None:
        """Post one signalled IBV_WR_ATOMIC_FETCH_AND_ADD (``compare_add`` is the addend) or
        IBV_WR_ATOMIC_CMP_AND_SWP on the 8-byte word at ``remote_addr`` of the peer's region ``rkey``; the
        word's original value lands in the first 8 bytes of ``local``."""

    def read_recv(self, slot: int, length: int) -> bytes:
        """The first ``length`` bytes of receive buffer ``slot`` (``length`` <= the buffer size)."""
        ...

    def completions(self) -> list[Completion]:
        """Consume a pending channel event (if any), re-arm the CQ and poll it empty. Never blocks."""
        ...

    def close(self) -> None:
        """Destroy the QP, CQ, channel and memory regions (idempotent)."""


class CmId(Protocol):
    """One rdma_cm id; see the module docstring."""

    def resolve_addr(self, src: str, dst: str, port: int, timeout_ms: int) -> None: ...
    def resolve_route(self, timeout_ms: int) -> None: ...

    def listen(self, addr: str, port: int, backlog: int) -> None:
        """Bind to ``addr`` (a specific address: wildcard binds crash pyverbs 44) and listen."""

    def create_qp(self, config: QpConfig) -> QueuePair:
        """The id is bound to a device (route resolved, or a request): make its queue pair (in RESET)."""
        ...

    def connect(self, params: ConnParams) -> None: ...
    def accept(self, params: ConnParams) -> None: ...
    def reject(self, data: bytes) -> None: ...

    def establish(self) -> None:
        """Active side with an external QP: send the RTU after CONNECT_RESPONSE (``rdma_establish``)."""

    def disconnect(self) -> None: ...

    def close(self) -> None:
        """Destroy the id (``rdma_destroy_id``; idempotent). A connected id sends a DREQ, a requested one
        a REJ."""


class CmChannel(Protocol):
    def fileno(self) -> int: ...

    def get_event(self) -> CmEvent | None:
        """The next event, acknowledged, or None if none is pending (never blocks)."""
        ...

    def create_id(self) -> CmId: ...
    def close(self) -> None: ...


class Verbs(Protocol):
    def create_channel(self) -> CmChannel: ...

    def addr_device(self, addr: str) -> str | None:
        """The RDMA device (an IB CA) that local IPv4 address ``addr`` belongs to, None if none: ib.c
        ``rds_ib_laddr_check`` (``rdma_bind_addr`` of a fresh id to the address, port 0). Never raises."""
        ...
