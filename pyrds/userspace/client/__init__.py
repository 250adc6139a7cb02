"""The application side: what runs inside the program that uses a userspace RDS socket.

:mod:`.socket` the ``RDSSocket`` class, :mod:`.autostart` finding (or starting) the namespace's stack service,
:mod:`.control` stack-wide settings without a socket. It shares only :mod:`pyrds.userspace.rpc` (the wire
format) and :mod:`pyrds.userspace.config` with the daemon side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyrds.userspace.client.socket import RDSSocket

__all__ = ["RDSSocket"]


def __getattr__(name: str) -> Any:
    """``RDSSocket`` on first use: :mod:`.autostart` alone (``pyrds stack``) does not load the socket."""
    if name == "RDSSocket":
        from pyrds.userspace.client.socket import RDSSocket

        return RDSSocket
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
