"""pyrds: Linux RDS (Reliable Datagram Sockets) for Python.

``pyrds.socket()`` returns an RDS socket from the kernel backend (native AF_RDS) or from the userspace
backend (an RDS/TCP stack shared by the processes of a network namespace). Both implement
:class:`pyrds.api.RDSSocketBase`, raise the same errno and return the same records.
"""

from __future__ import annotations

import importlib
from typing import Literal

from pyrds.api import RDSSocketBase
from pyrds.constants import AF_RDS, SOL_RDS, CmsgType, InfoType, SockOpt, Transport

__all__ = [
    "__version__",
    "AF_RDS",
    "SOL_RDS",
    "CmsgType",
    "InfoType",
    "RDSSocketBase",
    "SockOpt",
    "Transport",
    "available_backends",
    "kernel_available",
    "socket",
]

BackendChoice = Literal["auto", "kernel", "userspace"]

DISTRIBUTION = "linux-rds"  # the PyPI name `pyrds` belongs to another project


def _version() -> str:
    """The installed distribution's version; a checkout used without installing says so."""
    import importlib.metadata  # ~1.5 s in a TCG guest: only when someone asks for the version

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


__version__: str


def __getattr__(name: str) -> str:
    """``pyrds.__version__``, looked up on first use (PEP 562): importing pyrds must stay cheap, since every
    CLI call, stack service and test agent imports it."""
    if name == "__version__":
        version = _version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'pyrds' has no attribute {name!r}")


def kernel_available() -> bool:
    """True when this kernel can create AF_RDS sockets (the rds module is loaded or loadable)."""
    import socket as _socket

    try:
        s = _socket.socket(AF_RDS, _socket.SOCK_SEQPACKET, 0)
    except OSError:
        return False
    s.close()
    return True


def available_backends() -> list[str]:
    names = ["userspace"]
    if kernel_available():
        names.insert(0, "kernel")
    return names


def socket(backend: BackendChoice = "auto") -> RDSSocketBase:
    """Create an RDS socket; ``auto`` picks the kernel when AF_RDS is there, else userspace."""
    if backend not in ("auto", "kernel", "userspace"):
        raise ValueError(f"unknown backend {backend!r}: use 'auto', 'kernel' or 'userspace'")
    if backend == "auto":
        backend = "kernel" if kernel_available() else "userspace"
    module = importlib.import_module(f"pyrds.{backend}")
    sock: RDSSocketBase = module.RDSSocket()
    return sock
