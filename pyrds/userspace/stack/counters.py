"""RDS_INFO_COUNTERS-compatible statistics.

RDS_INFO_COUNTERS lists exactly the newest kernel's (7.3) ``rds_stat_names`` (net/rds/stats.c: 6.1's names
plus ``mprds_catchup_tx0_retries``, appended in 7.0), then -- only when the RDS/IB transport is attached, as
a kernel lists them only with rds_rdma loaded -- the IB transport's ``rds_ib_stat_names`` (net/rds/ib_stats.c,
:data:`IB_NAMES`), then the TCP transport's ``rds_tcp_stat_names`` (net/rds/tcp_stats.c, unchanged since 6.1),
in the kernel's order (``rds_stats_info`` copies the core names, then ``rds_trans_stats_info_copy`` the
transports' by ``t_type``: IB = 0 before TCP = 2). The stack also keeps a few
userspace-only counters (:data:`EXTRA_NAMES`); they are not in RDS_INFO_COUNTERS (the kernel has no such
names) but can be read with :func:`pyrds.userspace.control.stack_counters` (the private getsockopt
:data:`PYRDS_INFO_STACK_COUNTERS`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from pyrds.userspace.proto.events import DuplicateDropped, PingReceived

__all__ = [
    "count_receive_event",
    "EXTRA_NAMES",
    "IB_NAMES",
    "INFO_NAMES",
    "KERNEL_NAMES",
    "TCP_NAMES",
    "info_counters",
    "new_counters",
]

KERNEL_NAMES = (
    "conn_reset",
    "recv_drop_bad_checksum",
    "recv_drop_old_seq",
    "recv_drop_no_sock",
    "recv_drop_dead_sock",
    "recv_deliver_raced",
    "recv_delivered",
    "recv_queued",
    "recv_immediate_retry",
    "recv_delayed_retry",
    "recv_ack_required",
    "recv_rdma_bytes",
    "recv_ping",
    "send_queue_empty",
    "send_queue_full",
    "send_lock_contention",
    "send_lock_queue_raced",
    "send_immediate_retry",
    "send_delayed_retry",
    "send_drop_acked",
    "send_ack_required",
    "send_queued",
    "send_rdma",
    "send_rdma_bytes",
    "send_pong",
    "page_remainder_hit",
    "page_remainder_miss",
    "copy_to_user",
    "copy_from_user",
    "cong_update_queued",
    "cong_update_received",
    "cong_send_error",
    "cong_send_blocked",
    "recv_bytes_added_to_sock",
    "recv_bytes_freed_fromsock",
    "send_stuck_rm",
    "mprds_catchup_tx0_retries",  # 7.0+: a path > 0 waited for path 0 to catch up after fan-out
)
TCP_NAMES = (
    "tcp_data_ready_calls",
    "tcp_write_space_calls",
    "tcp_sndbuf_full",
    "tcp_connect_raced",
    "tcp_listen_closed_stale",
)
#: ``rds_ib_stat_names`` (net/rds/ib_stats.c; the same 39 names from 5.x to 7.3). What the userspace RDS/IB
#: transport counts is in docs/userspace.md ("RDS/IB counters"); the others stay 0.
IB_NAMES = (
    "ib_connect_raced",
    "ib_listen_closed_stale",
    "ib_evt_handler_call",
    "ib_tasklet_call",
    "ib_tx_cq_event",
    "ib_tx_ring_full",
    "ib_tx_throttle",
    "ib_tx_sg_mapping_failure",
    "ib_tx_stalled",
    "ib_tx_credit_updates",
    "ib_rx_cq_event",
    "ib_rx_ring_empty",
    "ib_rx_refill_from_cq",
    "ib_rx_refill_from_thread",
    "ib_rx_alloc_limit",
    "ib_rx_total_frags",
    "ib_rx_total_incs",
    "ib_rx_credit_updates",
    "ib_ack_sent",
    "ib_ack_send_failure",
    "ib_ack_send_delayed",
    "ib_ack_send_piggybacked",
    "ib_ack_received",
    "ib_rdma_mr_8k_alloc",
    "ib_rdma_mr_8k_free",
    "ib_rdma_mr_8k_used",
    "ib_rdma_mr_8k_pool_flush",
    "ib_rdma_mr_8k_pool_wait",
    "ib_rdma_mr_8k_pool_depleted",
    "ib_rdma_mr_1m_alloc",
    "ib_rdma_mr_1m_free",
    "ib_rdma_mr_1m_used",
    "ib_rdma_mr_1m_pool_flush",
    "ib_rdma_mr_1m_pool_wait",
    "ib_rdma_mr_1m_pool_depleted",
    "ib_rdma_mr_8k_reused",
    "ib_rdma_mr_1m_reused",
    "ib_atomic_cswp",
    "ib_atomic_fadd",
)
#: what RDS_INFO_COUNTERS reports without RDS/IB, in this order
INFO_NAMES = (*KERNEL_NAMES, *TCP_NAMES)
#: userspace-only counters (no kernel equivalent): only in ``pyrds.userspace.control.stack_counters``
EXTRA_NAMES = (
    "tcp_protocol_error",
    "tcp_accept_refused",
    "recv_drop_dup",
    "send_canceled",
    "tcp_connect_raced",
    "tcp_close_unread",  # TCP connections closed with received bytes nobody read (RDS/TCP: acked, so lost)
    "tcp_close_unread_bytes",
    "recv_cap_hold",  # a connection stopped being read: a receiving socket's queue was over its cap
    "send_cap_refused",  # a local send refused (ENOBUFS): the destination's receive queue is over its cap
    "pong_dropped",  # a ping not answered: its path already held the maximum of unacked pongs
    "accept_emfile",  # a connection accepted at EMFILE/ENFILE with the spare fd and refused at once
    "tcp_accept_deferred",  # an incoming connection held unread: its path still had a connection
    "tcp_accept_refused_live",  # a waiting connection refused: its path's own connection proved alive
    "tcp_timed_out",  # a connection TCP gave up on (ETIMEDOUT: TCP_USER_TIMEOUT or keepalive)
    "tcp_path_silent_dropped",  # a path's connection the peer went silent on, given up for its re-dial
    "tcp_dial_timed_out",  # a dial not connected within rds_tcp_user_timeout_ms, given up (re-dialled later)
    "recv_pushed",  # messages pushed to their reader's data channel (the rest are served by request)
    "send_posted",  # sends a client made without waiting for the stack (under a grant: service/posting.py)
    "send_post_refused",  # posted sends refused (outside their grant: a client that broke the rules)
    "control_reads_empty",  # control connection reads that found nothing (EAGAIN): what the data path wastes
    "tcp_ack_checks",  # SIOCOUTQ asked for the messages an RDS/TCP path's TCP acked (TcpPath.check_acks)
    "send_queue_msgs_full",  # empty sends refused (EAGAIN): rds_sndbuf empty messages in flight on the socket
    "ib_recv_over_cap",  # an RDS/IB message queued for a socket already over its receive cap
    "rdma_read_writeback_failed",  # an RDMA READ's bytes could not be written to the client (EFAULT)
    "rdma_mr_writeback_failed",  # what the peer wrote into an MR could not be written to the client
    "rdma_mr_gap_sync",  # a socket's MRs synced to its client after a gap in a peer's sequence (silent ops)
)


def new_counters() -> dict[str, int]:
    return dict.fromkeys((*INFO_NAMES, *EXTRA_NAMES), 0)


def info_counters(counters: dict[str, int], ib: Mapping[str, int] | None = None) -> list[tuple[str, int]]:
    """The RDS_INFO_COUNTERS rows: the kernel's names only, in the kernel's order. ``ib``: the RDS/IB
    transport's counters when it is attached (its ``rds_ib_stat_names`` rows, and what it counts under core
    names, such as ``send_ack_required``, added to the stack's), None without it (no IB rows)."""
    if ib is None:
        return [(name, counters.get(name, 0)) for name in INFO_NAMES]
    core = [(name, counters.get(name, 0) + ib.get(name, 0)) for name in KERNEL_NAMES]
    ib_rows = [(name, ib.get(name, 0)) for name in IB_NAMES]
    return [*core, *ib_rows, *((name, counters.get(name, 0)) for name in TCP_NAMES)]


def count_receive_event(counters: MutableMapping[str, int], event: PingReceived | DuplicateDropped) -> None:
    """What the kernel's receive path (``rds_recv_incoming``) counts for a ping to port 0 (recv_ping, and
    send_pong or, when the pong could not be queued, nothing sent) and for a message already received
    (recv_drop_old_seq): the same for every transport, so counted here once."""
    if isinstance(event, PingReceived):
        counters["recv_ping"] += 1
        counters["send_pong"] += int(event.pong_queued)
        counters["pong_dropped"] += int(not event.pong_queued)
    else:
        counters["recv_drop_old_seq"] += 1
