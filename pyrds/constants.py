"""Constants of ``include/uapi/linux/rds.h`` and of the RDS/TCP wire protocol.

Shared by both backends: a program that switches backend sees the same values.
"""

from __future__ import annotations

import enum

AF_RDS = 21
PF_RDS = AF_RDS
SOL_RDS = 276
RDS_IB_ABI_VERSION = 0x301

SIOCRDSSETTOS = 0x89E0
SIOCRDSGETTOS = 0x89E1

RDS_TCP_PORT = 16385
RDS_MAX_MSG_SIZE = 1 << 20
RDS_CONG_MAP_BYTES = 8192
RDS_CONG_MONITOR_SIZE = 64
RDS_MAX_ZCOOKIES = 8
TRANSNAMSIZ = 16
RDS_MPATH_WORKERS = 8
RDS_FLAG_PROBE_PORT = 1
RDS_RECONNECT_MIN_DELAY_MS = 1  # sysctl net.rds.reconnect_min_delay_ms default
RDS_RECONNECT_MAX_DELAY_MS = 1000  # sysctl net.rds.reconnect_max_delay_ms default

# Linux socket constants RDS uses that Python's socket module lacks (asm-generic/socket.h, linux/socket.h)
MSG_ZEROCOPY = 0x4000000
SO_TIMESTAMP_OLD = 29
SO_TIMESTAMP_NEW = 63
SO_ZEROCOPY = 60
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33

#: SOL_RDS getsockopt of the pyrds userspace stack only (outside RDS_INFO_FIRST..LAST: the kernel says
#: ENOPROTOOPT): every counter of the stack, as RDS_INFO_COUNTERS records, userspace-only ones included
PYRDS_INFO_STACK_COUNTERS = 10900


class SockOpt(enum.IntEnum):
    """``SOL_RDS`` socket options."""

    RDS_CANCEL_SENT_TO = 1
    RDS_GET_MR = 2
    RDS_FREE_MR = 3
    RDS_RECVERR = 5
    RDS_CONG_MONITOR = 6
    RDS_GET_MR_FOR_DEST = 7
    SO_RDS_TRANSPORT = 8
    SO_RDS_MSG_RXPATH_LATENCY = 10


class Transport(enum.IntEnum):
    """``SO_RDS_TRANSPORT`` values (LOOP is internal: what getsockopt reports for loop-bound sockets)."""

    IB = 0
    IWARP = 1
    TCP = 2
    LOOP = 3
    NONE = -1

    @property
    def transport_name(self) -> str:
        return {0: "infiniband", 1: "iwarp", 2: "tcp", 3: "loop", -1: "none"}[self.value]


RDS_TRANS_COUNT = 3


class CmsgType(enum.IntEnum):
    RDS_CMSG_RDMA_ARGS = 1
    RDS_CMSG_RDMA_DEST = 2
    RDS_CMSG_RDMA_MAP = 3
    RDS_CMSG_RDMA_STATUS = 4
    RDS_CMSG_CONG_UPDATE = 5
    RDS_CMSG_ATOMIC_FADD = 6
    RDS_CMSG_ATOMIC_CSWP = 7
    RDS_CMSG_MASKED_ATOMIC_FADD = 8
    RDS_CMSG_MASKED_ATOMIC_CSWP = 9
    RDS_CMSG_RXPATH_LATENCY = 11
    RDS_CMSG_ZCOPY_COOKIE = 12
    RDS_CMSG_ZCOPY_COMPLETION = 13


class InfoType(enum.IntEnum):
    RDS_INFO_COUNTERS = 10000
    RDS_INFO_CONNECTIONS = 10001
    RDS_INFO_SEND_MESSAGES = 10003
    RDS_INFO_RETRANS_MESSAGES = 10004
    RDS_INFO_RECV_MESSAGES = 10005
    RDS_INFO_SOCKETS = 10006
    RDS_INFO_TCP_SOCKETS = 10007
    RDS_INFO_IB_CONNECTIONS = 10008
    RDS_INFO_CONNECTION_STATS = 10009
    RDS_INFO_IWARP_CONNECTIONS = 10010
    RDS6_INFO_CONNECTIONS = 10011
    RDS6_INFO_SEND_MESSAGES = 10012
    RDS6_INFO_RETRANS_MESSAGES = 10013
    RDS6_INFO_RECV_MESSAGES = 10014
    RDS6_INFO_SOCKETS = 10015
    RDS6_INFO_TCP_SOCKETS = 10016
    RDS6_INFO_IB_CONNECTIONS = 10017


RDS_INFO_FIRST = InfoType.RDS_INFO_COUNTERS
RDS_INFO_LAST = InfoType.RDS6_INFO_IB_CONNECTIONS


class InfoConnectionFlag(enum.IntFlag):
    SENDING = 1
    CONNECTING = 2
    CONNECTED = 4


class InfoMessageFlag(enum.IntFlag):
    ACK = 1
    FAST_ACK = 2


class RdmaStatus(enum.IntEnum):
    SUCCESS = 0
    REMOTE_ERROR = 1
    CANCELED = 2
    DROPPED = 3
    OTHER_ERROR = 4


class RdmaFlag(enum.IntFlag):
    READWRITE = 0x0001
    FENCE = 0x0002
    INVALIDATE = 0x0004
    USE_ONCE = 0x0008
    DONTWAIT = 0x0010
    NOTIFY_ME = 0x0020
    SILENT = 0x0040


class RxPathLatencyPoint(enum.IntEnum):
    """``enum rds_message_rxpath_latency``."""

    RDS_MSG_RX_HDR_TO_DGRAM_START = 0
    RDS_MSG_RX_DGRAM_REASSEMBLE = 1
    RDS_MSG_RX_DGRAM_DELIVERED = 2
    RDS_MSG_RX_DGRAM_TRACE_MAX = 3


RDS_RX_MAX_TRACES = RxPathLatencyPoint.RDS_MSG_RX_DGRAM_TRACE_MAX + 1


class HeaderFlag(enum.IntFlag):
    """``h_flags`` of ``struct rds_header``."""

    CONG_BITMAP = 0x01
    ACK_REQUIRED = 0x02
    RETRANSMITTED = 0x04


class ExtHeaderType(enum.IntEnum):
    NONE = 0
    VERSION = 1
    RDMA = 2
    RDMA_DEST = 3
    NPATHS = 5
    GEN_NUM = 6
    SPORT_IDX = 8  # 7.x: the sender's dialer encodes the path index in its TCP source port (1-byte body, 0)


RDS_EXTHDR_SIZE = 16
RDS_EXTHDR_MAX = 16  # __RDS_EXTHDR_MAX: extension types >= this end the extension list
RDS_HEADER_SIZE = 48


def cong_monitor_bit(port: int) -> int:
    """Bit number of ``port`` in the RDS_CONG_MONITOR mask (``RDS_CONG_MONITOR_BIT``)."""
    return port % RDS_CONG_MONITOR_SIZE


def cong_monitor_mask(port: int) -> int:
    """Mask of ``port`` in the RDS_CONG_MONITOR mask (``RDS_CONG_MONITOR_MASK``)."""
    return 1 << cong_monitor_bit(port)
