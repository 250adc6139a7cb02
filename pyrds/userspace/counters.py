"""RDS_INFO_COUNTERS-compatible statistics (names as the kernel's rds_stat_names / rds_tcp_stat_names)."""

from __future__ import annotations

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
    "recv_bytes_added_to_socket",
    "recv_bytes_removed_from_socket",
    "send_stuck_rm",
    "mprds_catchup_tx0_retries",
)
TCP_NAMES = (
    "tcp_data_ready_calls",
    "tcp_write_space_calls",
    "tcp_sndbuf_full",
    "tcp_connect_raced",
    "tcp_listen_closed_stale",
)
#: userspace-only counters (no kernel equivalent)
EXTRA_NAMES = ("tcp_protocol_error", "tcp_accept_refused", "recv_drop_dup", "send_canceled")


def new_counters() -> dict[str, int]:
    return dict.fromkeys((*KERNEL_NAMES, *TCP_NAMES, *EXTRA_NAMES), 0)
