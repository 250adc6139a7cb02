"""The one exception type of the sans-IO core."""

from __future__ import annotations

__all__ = ["ProtocolError"]


class ProtocolError(ValueError):
    """Bad input from the peer: the caller drops the TCP connection.

    ``reason`` is a short stable identifier (``"msg_too_long"``, ``"bad_cong_map_len"``, ...) usable as a
    counter key; ``str(exc)`` is the human-readable detail.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        #: Events produced from the input that preceded the bad bytes (the caller should still act on them).
        self.partial: list[object] = []
