"""Read RDS_INFO tables without a bound socket (what ``rds-info`` does)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyrds import info as _info
from pyrds.constants import InfoType


def read_info_raw(info_type: int) -> tuple[int, bytes]:
    """``(record size, bytes)`` of one RDS_INFO table, read through a temporary unbound AF_RDS socket."""
    from pyrds.kernel.socket import RDSSocket

    with RDSSocket() as sock:
        assert isinstance(sock, RDSSocket)
        return sock.get_info_raw(info_type)


def read_info(info_type: int) -> Sequence[Any]:
    """One RDS_INFO table as typed records (:mod:`pyrds.info`)."""
    from pyrds.kernel.socket import RDSSocket

    with RDSSocket() as sock:
        return sock.get_info(info_type)


def read_counters() -> dict[str, int]:
    """RDS_INFO_COUNTERS as ``{name: value}``."""
    return _info.counters_dict(list(read_info(InfoType.RDS_INFO_COUNTERS)))
