"""What a failed request answers: an errno (or the congestion wait code), never a dropped connection."""

from __future__ import annotations

import errno
import logging
from typing import Any

from pyrds.userspace import rpc
from pyrds.userspace.stack.errors import MustWait, PushedFirst, StackError

__all__ = ["error_reply"]

log = logging.getLogger("pyrds.userspace.service")


def error_reply(exc: Exception) -> tuple[int, Any]:
    """A failed request's reply: (errno or :data:`rpc.WAIT_CONG`, optlen or None); unexpected exceptions are
    logged."""
    if isinstance(exc, MustWait):
        return rpc.WAIT_CONG, None
    if isinstance(exc, PushedFirst):
        return rpc.RETRY_PUSHED, None
    if isinstance(exc, StackError):
        return int(exc.code), rpc.plain(exc.args[1]) if len(exc.args) > 1 else None
    if isinstance(exc, OSError) and exc.errno:
        return int(exc.errno), None
    if isinstance(exc, (ValueError, TypeError, KeyError, OverflowError)):
        log.debug("request refused: %r", exc)
        return errno.EINVAL, None
    log.exception("request failed")
    return errno.EIO, None
