"""What a node's RDS stack shows, printed to a test's log when a transfer failed or stalled (two-node and
RDS/IB scenarios alike: :meth:`pyrds.testing.topology.TwoNodes.dump_state`,
:meth:`pyrds.testing.ib.IbPair.dump_state`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def print_rds_state(sock: Any, backend: str, tables: Sequence[int] = ()) -> None:
    """Print the rows of the RDS_INFO ``tables`` of ``sock``'s stack, its non-zero counters (on a userspace
    socket also the stack-only ones, e.g. connections closed unread) and its send, retransmit and receive
    queue lengths. Never raises: a diagnostic must not replace the test's own error."""
    from pyrds.constants import PYRDS_INFO_STACK_COUNTERS, SOL_RDS, InfoType
    from pyrds.info import counters_dict, parse_info

    try:
        for t in tables:
            name = InfoType(t).name
            for rec in sock.get_info(t):
                print(f"  {name}: {rec}")
        counters = counters_dict(sock.get_info(InfoType.RDS_INFO_COUNTERS))
        print("  counters:", {k: v for k, v in counters.items() if v})
        if backend == "userspace":
            raw = sock.getsockopt(SOL_RDS, PYRDS_INFO_STACK_COUNTERS, 1 << 16)
            every = counters_dict(parse_info(InfoType.RDS_INFO_COUNTERS, raw))
            extra = {k: v for k, v in every.items() if v and k not in counters}
            print("  stack-only counters:", extra)
        queued = len(sock.get_info(InfoType.RDS_INFO_SEND_MESSAGES))
        retrans = len(sock.get_info(InfoType.RDS_INFO_RETRANS_MESSAGES))
        received = len(sock.get_info(InfoType.RDS_INFO_RECV_MESSAGES))
        # an empty receive queue on the receiver while its sender keeps getting ENOBUFS: the sender's copy
        # of the congestion map is stale (an uncongestion update lost or overtaken)
        print(f"  send queue {queued}, retransmit queue {retrans}, receive queue {received}")
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not replace the test's own error
        print(f"  (state not readable: {type(exc).__name__}: {exc})")
