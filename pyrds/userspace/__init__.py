"""Userspace RDS: the application side (``client``), the daemon side (``service`` over ``stack`` and
``transports``), the sans-IO protocol core (``proto``) and what both sides share (``rpc``, ``config``).

``RDSSocket`` (from :mod:`pyrds.userspace.client`) is what ``pyrds.socket("userspace")`` returns; stack-wide
settings are in :mod:`pyrds.userspace.control`. See docs/design.md for the rooms and their dependency rule.

``RDSSocket`` is imported on first use: importing a room of this package (``pyrds.userspace.rpc`` for the
``pyrds stack`` command, ``pyrds.userspace.service`` for the daemon) does not load the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyrds.userspace.client import RDSSocket

__all__ = ["RDSSocket"]


def __getattr__(name: str) -> Any:
    if name == "RDSSocket":
        from pyrds.userspace.client import RDSSocket

        return RDSSocket
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
