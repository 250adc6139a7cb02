"""The daemon side: the stack service of a network namespace (``python -m pyrds.userspace.service``).

:mod:`.server` control connections and the data path, :mod:`.handlers` the other operations as a table,
:mod:`.replies` errors as reply codes, :mod:`.eventloop` the selector loop and timers, :mod:`.readiness` the
fd whose poll state mirrors a socket, :mod:`.daemon` the process entry point.
"""

from __future__ import annotations

from pyrds.userspace.service.daemon import main
from pyrds.userspace.service.server import Service

__all__ = ["Service", "main"]
