"""Native AF_RDS backend (the running kernel's RDS), driven through libc with ctypes."""

from __future__ import annotations

from pyrds.kernel.socket import RDSSocket

__all__ = ["RDSSocket"]
