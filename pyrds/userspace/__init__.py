"""Userspace RDS: the application side (``client``), the daemon side (``service`` over ``stack`` and
``transports``), the sans-IO protocol core (``proto``) and what both sides share (``rpc``, ``config``).

``RDSSocket`` (from :mod:`pyrds.userspace.client`) is what ``pyrds.socket("userspace")`` returns; stack-wide
settings are in :mod:`pyrds.userspace.control`. See docs/design.md for the rooms and their dependency rule.
"""

from __future__ import annotations

from pyrds.userspace.client import RDSSocket

__all__ = ["RDSSocket"]
