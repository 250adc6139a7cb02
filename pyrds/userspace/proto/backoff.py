"""Reconnect backoff (net/rds/threads.c ``rds_queue_reconnect``).

First attempt after a drop: immediately, and the ceiling becomes ``min``.  Each later attempt waits
``rand % ceiling`` (uniform in ``[0, ceiling)``) and then doubles the ceiling up to ``max``.  A completed
connection resets it (``rds_connect_path_complete`` zeroes ``cp_reconnect_jiffies``).  On TCP only the side
for which :func:`~pyrds.userspace.proto.handshake.should_dial` is true reconnects.
"""

from __future__ import annotations

import random

from pyrds.constants import RDS_RECONNECT_MAX_DELAY_MS, RDS_RECONNECT_MIN_DELAY_MS

__all__ = ["ReconnectBackoff"]


class ReconnectBackoff:
    def __init__(
        self,
        min_ms: int = RDS_RECONNECT_MIN_DELAY_MS,
        max_ms: int = RDS_RECONNECT_MAX_DELAY_MS,
        rng: random.Random | None = None,
    ) -> None:
        if min_ms < 1 or max_ms < min_ms:
            raise ValueError("need 1 <= min_ms <= max_ms")
        self.min_ms = min_ms
        self.max_ms = max_ms
        self._rng = rng if rng is not None else random.Random()
        self._ceiling_ms = 0
        self.next_attempt_at: float | None = None

    @property
    def ceiling_ms(self) -> int:
        """Current ``cp_reconnect_jiffies`` in ms (0 = next attempt is immediate)."""
        return self._ceiling_ms

    def next_delay(self, now: float) -> float:
        """Seconds to wait before the next connect attempt; also sets ``next_attempt_at``."""
        if self._ceiling_ms == 0:
            self._ceiling_ms = self.min_ms
            delay_ms = 0
        else:
            delay_ms = self._rng.randrange(self._ceiling_ms)
            self._ceiling_ms = min(self._ceiling_ms * 2, self.max_ms)
        delay = delay_ms / 1000.0
        self.next_attempt_at = now + delay
        return delay

    def reset(self) -> None:
        """Connection established: the next drop reconnects immediately again."""
        self._ceiling_ms = 0
        self.next_attempt_at = None
