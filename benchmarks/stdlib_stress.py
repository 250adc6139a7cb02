"""``pyrds stress`` with every RDS socket a plain stdlib ``socket.socket(AF_RDS, SOCK_SEQPACKET)``.

The benchmark's baseline: the kernel driven by the stdlib, through the very same stress code (message
pattern, timing, JSON) as ``pyrds stress --backend kernel``, so the two rows differ only in the socket
object. Usage is the CLI's: ``python benchmarks/stdlib_stress.py stress --backend kernel -s A -r B ...``
(``--backend`` must name ``kernel`` to pass the CLI's checks; the sockets report ``backend = "stdlib"``).
The stress code calls only what a stdlib socket has: bind, setsockopt, setblocking, fileno, sendto,
recvmsg, close. IPv4 only (the stdlib's AF_RDS addresses are ``sockaddr_in``).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

AF_RDS = 21


class StdlibRDSSocket(socket.socket):
    """A stdlib AF_RDS socket plus the one attribute the stress code reads besides the socket API."""

    __slots__ = ()
    backend = "stdlib"

    def __init__(self) -> None:
        super().__init__(AF_RDS, socket.SOCK_SEQPACKET, 0)


def stdlib_socket(backend: Any = "kernel") -> StdlibRDSSocket:
    return StdlibRDSSocket()


def main(argv: list[str] | None = None) -> int:
    import pyrds
    from pyrds.cli import main as cli

    pyrds.socket = stdlib_socket  # type: ignore[assignment]
    rc: int = cli.main(sys.argv[1:] if argv is None else argv)
    return rc


if __name__ == "__main__":
    sys.exit(main())
