"""Userspace RDS/TCP stack: the sans-IO protocol core (``proto``), the stack service and its transports.

``RDSSocket`` (from :mod:`pyrds.userspace.client`) is what ``pyrds.socket("userspace")`` returns.
"""

from __future__ import annotations

from pyrds.userspace.client import RDSSocket

__all__ = ["RDSSocket"]
