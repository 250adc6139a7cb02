"""Fixed numbers of the kernel's RDS/IB wire (rds-ib-facts.md sections 1-3, with the kernel sources named).

Ports and versions: rds.h (``RDS_PORT``, ``RDS_PROTOCOL_*``), rdma_transport.h (``RDS_CM_PORT``,
``RDS_RDMA_REJ_INCOMPAT``); fragments: ib.h (``RDS_FRAG_SIZE``), ib_recv.c (the two receive SGEs);
signalling: ib_send.c (``rds_ib_set_wr_signal_state``), ib_sysctl.c (``max_unsignaled_wr``); ack policy:
send.c ``rds_send_xmit`` with the sysctls ``net.rds.max_unacked_packets`` / ``max_unacked_bytes``.
"""

from __future__ import annotations

import enum

from pyrds.constants import RDS_HEADER_SIZE

__all__ = [
    "ACK_WR_ID",
    "CM_PRIVATE_DATA_MAX",
    "MAX_RECV_WR",
    "MAX_SEND_WR",
    "MAX_UNACKED_BYTES",
    "MAX_UNACKED_PACKETS",
    "MAX_UNSIGNALED_WR",
    "RDS_CM_PORT",
    "RDS_FRAG_SIZE",
    "RDS_IB_PORT",
    "RDS_IB_SUPPORTED_PROTOCOLS",
    "RECV_BUF_SIZE",
    "REJ_INCOMPAT",
    "WcOpcode",
    "version",
]

#: rdma_cm listener for IPv4 (``RDS_PORT``), in the RDMA_PS_TCP port space
RDS_IB_PORT = 18634
#: rdma_cm listener for IPv6 (``RDS_CM_PORT``)
RDS_CM_PORT = 16385
#: payload bytes per receive buffer and so per SEND (``RDS_FRAG_SIZE``, independent of PAGE_SIZE)
RDS_FRAG_SIZE = 4096
#: one receive work request: SGE0 the 48-byte header, SGE1 one fragment
RECV_BUF_SIZE = RDS_HEADER_SIZE + RDS_FRAG_SIZE
#: ``RDS_IB_SUPPORTED_PROTOCOLS``: minor versions 4.0 and 4.1
RDS_IB_SUPPORTED_PROTOCOLS = 0x0003
#: the REJ consumer-defined reason the kernel always sends (``RDS_RDMA_REJ_INCOMPAT``)
REJ_INCOMPAT = 1
#: largest private-data area rdma_cm hands to a consumer (IB CM REP: 196 bytes; REQ 56, REJ 148)
CM_PRIVATE_DATA_MAX = 196
#: send ring (``net.rds.ib.max_send_wr``)
MAX_SEND_WR = 256
#: receive ring (``net.rds.ib.max_recv_wr``)
MAX_RECV_WR = 1024
#: a signalled WR at least after this many unsignalled ones (``net.rds.ib.max_unsignaled_wr``)
MAX_UNSIGNALED_WR = 16
#: ``net.rds.max_unacked_packets`` / ``net.rds.max_unacked_bytes`` defaults
MAX_UNACKED_PACKETS = 8
MAX_UNACKED_BYTES = 16 << 20
#: wr_id of the one preallocated ACK work request (``~0``)
ACK_WR_ID = (1 << 64) - 1


def version(major: int, minor: int) -> int:
    """``RDS_PROTOCOL(major, minor)``: 3.1 is 0x0301."""
    return (major << 8) | minor


class WcOpcode(enum.IntEnum):
    """Receive completion opcodes (``ibv_wc_opcode``) the engine tells apart."""

    RECV = 128  # IBV_WC_RECV
    RECV_RDMA_WITH_IMM = 129  # IBV_WC_RECV_RDMA_WITH_IMM: never valid on an RDS/IB receive (6.12.117+)
