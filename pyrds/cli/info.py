"""``pyrds info``: the RDS_INFO tables as aligned text or JSON, like rds-info.

Records come from ``sock.get_info(InfoType)`` (frozen dataclasses of :mod:`pyrds.info`) on either backend;
columns are the record fields, so a table prints the same whatever backend produced it.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import errno
import ipaddress
import json
import sys
from collections.abc import Sequence
from typing import Any

from pyrds.cli.common import UserError, add_backend_option, describe_oserror, open_socket
from pyrds.constants import InfoType

# option letter -> (key, title, v4 type, v6 type); same letters as rds-info
TABLES: dict[str, tuple[str, str, InfoType, InfoType]] = {
    "c": ("counters", "Counters", InfoType.RDS_INFO_COUNTERS, InfoType.RDS_INFO_COUNTERS),
    "k": ("sockets", "RDS Sockets", InfoType.RDS_INFO_SOCKETS, InfoType.RDS6_INFO_SOCKETS),
    "n": ("connections", "RDS Connections", InfoType.RDS_INFO_CONNECTIONS, InfoType.RDS6_INFO_CONNECTIONS),
    "r": (
        "recv_messages",
        "Receive Message Queue",
        InfoType.RDS_INFO_RECV_MESSAGES,
        InfoType.RDS6_INFO_RECV_MESSAGES,
    ),
    "s": (
        "send_messages",
        "Send Message Queue",
        InfoType.RDS_INFO_SEND_MESSAGES,
        InfoType.RDS6_INFO_SEND_MESSAGES,
    ),
    "t": ("tcp_sockets", "TCP Connections", InfoType.RDS_INFO_TCP_SOCKETS, InfoType.RDS6_INFO_TCP_SOCKETS),
    "T": (
        "retrans_messages",
        "Retransmit Queue",
        InfoType.RDS_INFO_RETRANS_MESSAGES,
        InfoType.RDS6_INFO_RETRANS_MESSAGES,
    ),
    "I": (
        "ib_connections",
        "RDMA Connections",
        InfoType.RDS_INFO_IB_CONNECTIONS,
        InfoType.RDS6_INFO_IB_CONNECTIONS,
    ),
}

HELP = {
    "c": "counters",
    "k": "sockets",
    "n": "connections",
    "r": "receive queue",
    "s": "send queue",
    "t": "TCP sockets",
    "T": "retransmit queue",
    "I": "IB (RDMA) connections",
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("info", help="print RDS_INFO tables (counters, sockets, connections, queues)")
    for letter in TABLES:
        p.add_argument(f"-{letter}", dest=f"t_{letter}", action="store_true", help=f"show {HELP[letter]}")
    p.add_argument("-6", dest="v6", action="store_true", help="use the RDS6_INFO (IPv6) tables")
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by table")
    p.add_argument("--nonzero", action="store_true", help="counters: hide zero values")
    add_backend_option(p)
    p.set_defaults(func=run)


def plain(value: Any) -> Any:
    """JSON-ready value of a record field."""
    if isinstance(value, enum.IntFlag):
        return int(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).rstrip(b"\0").decode("ascii", "replace")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def text(value: Any) -> str:
    if isinstance(value, enum.IntFlag):
        names = [m.name or "" for m in type(value) if m.value and (value & m.value) == m.value]
        return "|".join(names) if names else "-"
    if isinstance(value, enum.Enum):
        return str(value.name)
    p = plain(value)
    if isinstance(p, list):
        return ",".join(str(v) for v in p)
    return "" if p is None else str(p)


def record_dict(rec: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(rec) and not isinstance(rec, type):
        return {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}
    if hasattr(rec, "_asdict"):
        return dict(rec._asdict())
    return {"value": rec}


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Aligned columns: numbers right-aligned, text left-aligned, header from field names."""
    if not rows:
        return "  (empty)"
    cols = list(columns or rows[0].keys())
    cells = [[text(r.get(c)) for c in cols] for r in rows]
    numeric = [
        all(isinstance(r.get(c), int) and not isinstance(r.get(c), enum.Enum) for r in rows) for c in cols
    ]
    heads = [c.replace("_", " ") for c in cols]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(heads)]

    def fmt(row: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(row, widths, numeric, strict=True)]
        return ("  " + "  ".join(parts)).rstrip()

    return "\n".join([fmt(heads), *(fmt(r) for r in cells)])


def userspace_stack_running() -> bool:
    """True when this network namespace's userspace stack service accepts a control connection; never starts
    one (``pyrds info`` reads, it does not create the stack it would report on)."""
    from pyrds.userspace.client.autostart import connect_stack

    try:
        ctl = connect_stack(autostart=False)
    except OSError:
        return False
    ctl.close()
    return True


NO_STACK = "no pyrds userspace stack runs in this network namespace"


def idle_tables(letters: Sequence[str]) -> dict[str, Any]:
    """What a namespace without a userspace stack has: no sockets, connections or queued messages, every
    counter 0 (the counters live and die with the stack service)."""
    try:
        from pyrds.userspace.stack.counters import INFO_NAMES

        names: Sequence[str] = tuple(INFO_NAMES)
    except ImportError:
        names = ()
    result: dict[str, Any] = {}
    for letter in letters:
        key = TABLES[letter][0]
        if key == "counters":
            result[key] = [{"name": n, "value": 0} for n in names]
        elif key == "ib_connections":
            result[key] = {"error": f"not available: {NO_STACK}"}
        else:
            result[key] = []
    return result


def resolve_backend(backend: str) -> str:
    if backend != "auto":
        return backend
    import pyrds

    return "kernel" if pyrds.kernel_available() else "userspace"


def read_tables(backend: str, letters: Sequence[str], v6: bool) -> tuple[str, dict[str, Any]]:
    """Read each requested table; a table the stack lacks (ENOPROTOOPT) becomes {"error": ...}. On the
    userspace backend with no stack service running, the tables of an idle stack, and a note on stderr."""
    backend = resolve_backend(backend)
    if backend == "userspace" and not userspace_stack_running():
        print(f"pyrds info: {NO_STACK}: nothing is queued or connected", file=sys.stderr)
        return backend, idle_tables(letters)
    sock = open_socket(backend)
    result: dict[str, Any] = {}
    try:
        for letter in letters:
            key, _title, t4, t6 = TABLES[letter]
            itype = t6 if v6 else t4
            try:
                records = sock.get_info(itype)
            except OSError as exc:
                if exc.errno in (errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EINVAL):
                    result[key] = {"error": f"not available: {describe_oserror(exc)}"}
                    continue
                raise UserError(f"reading {itype.name} failed: {describe_oserror(exc)}", 1) from None
            result[key] = [record_dict(r) for r in records]
        return sock.backend, result
    finally:
        sock.close()


def run(args: argparse.Namespace) -> int:
    letters = [letter for letter in TABLES if getattr(args, f"t_{letter}")] or list(TABLES)
    backend, tables = read_tables(args.backend, letters, args.v6)
    if args.nonzero and isinstance(tables.get("counters"), list):
        tables["counters"] = [
            r
            for r in tables["counters"]
            if any(isinstance(v, int) and not isinstance(v, bool) and v for v in r.values())
        ]
    if args.json:
        doc: dict[str, Any] = {"backend": backend}
        for key, rows in tables.items():
            doc[key] = rows if isinstance(rows, dict) else [{k: plain(v) for k, v in r.items()} for r in rows]
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    first = True
    for letter in letters:
        key, title, _t4, _t6 = TABLES[letter]
        rows = tables[key]
        if not first:
            print()
        first = False
        print(f"{title}{' (IPv6)' if args.v6 and letter != 'c' else ''}:")
        if isinstance(rows, dict):
            print(f"  ({rows['error']})")
        else:
            print(format_table(rows))
    sys.stdout.flush()
    return 0
