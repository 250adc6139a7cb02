"""Helpers shared by the subcommands: backend option, address parsing, user errors."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket as _stdsocket
import sys
from typing import NoReturn

from pyrds.api import RDSSocketBase
from pyrds.constants import SOL_RDS, SockOpt, Transport

BACKENDS = ("auto", "kernel", "userspace")
#: ``--transport`` choices: the ``SO_RDS_TRANSPORT`` value each pins (unpinned, the bind address decides)
TRANSPORTS = {"tcp": Transport.TCP, "ib": Transport.IB}


class UserError(Exception):
    """A problem the user can fix: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="kernel (AF_RDS), userspace (pyrds RDS/TCP stack) or auto (kernel when AF_RDS exists)",
    )


def add_transport_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=tuple(TRANSPORTS),
        default=None,
        help="pin every socket to RDS/TCP or RDS/IB (SO_RDS_TRANSPORT, set before bind); default: unpinned, "
        "the bound address decides",
    )


def pin_transport(sock: RDSSocketBase, transport: str | None) -> None:
    """``SO_RDS_TRANSPORT`` = ``transport`` on an unbound socket (nothing for None); failures become one-line
    user errors that say what is missing."""
    if transport is None:
        return
    if transport not in TRANSPORTS:
        raise UserError(f"unknown transport {transport!r}")
    try:
        sock.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(TRANSPORTS[transport]))
    except OSError as exc:
        why = describe_oserror(exc)
        if exc.errno == errno.ENOPROTOOPT:
            why += (
                " (kernel: the transport's module, rds_tcp / rds_rdma, is not loaded; userspace: the stack "
                "has RDS/IB only with an RDMA device and pyverbs)"
            )
        elif exc.errno == errno.EPROTOTYPE:
            why += " (RDS/IB exists in the initial network namespace only)"
        raise UserError(f"cannot pin the socket to {transport.upper()}: {why}", 1) from None


def open_socket(backend: str) -> RDSSocketBase:
    """``pyrds.socket(backend)`` with failures turned into one-line user errors."""
    import pyrds

    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}")
    try:
        return pyrds.socket(backend)  # type: ignore[arg-type]
    except ModuleNotFoundError as exc:
        raise UserError(
            f"backend {backend!r} is not available in this installation ({exc.name})", 1
        ) from None
    except OSError as exc:
        if backend == "kernel" and exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EINVAL):
            raise UserError(
                "kernel backend unavailable: AF_RDS not supported (modprobe rds rds_tcp?)", 1
            ) from None
        raise UserError(f"cannot create an RDS socket ({backend}): {describe_oserror(exc)}", 1) from None


def describe_oserror(exc: OSError) -> str:
    if exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"{exc.strerror or exc} [{name}]"
    return str(exc)


def parse_ip(text: str, what: str = "address") -> str:
    """Validate a host (IPv4/IPv6 literal or resolvable name); return the literal address."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = _stdsocket.getaddrinfo(host, None, type=_stdsocket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        raise UserError(f"invalid {what} {text!r}: not an IP address and not resolvable") from None
    return str(infos[0][4][0])


def parse_host_port(text: str, default_port: int | None, what: str = "address") -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address."""
    port: int | None = default_port
    host = text
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise UserError(f"invalid {what} {text!r}: missing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise UserError(f"invalid {what} {text!r}")
            port = parse_port(rest[1:])
    elif text.count(":") == 1:
        host, p = text.split(":")
        port = parse_port(p)
    return parse_ip(host, what), port


def parse_port(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise UserError(f"invalid port {text!r}") from None
    if not 0 <= value <= 0xFFFF:
        raise UserError(f"invalid port {value}: must be 0-65535")
    return value


def sockaddr(host: str, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
    if ipaddress.ip_address(host).version == 6:
        return (host, port, 0, 0)
    return (host, port)


def source_for(dest: str) -> str:
    """The local address the routing table uses to reach ``dest`` (like rds-ping without -I)."""
    ip = ipaddress.ip_address(dest)
    if ip.is_loopback:
        return dest
    family = _stdsocket.AF_INET6 if ip.version == 6 else _stdsocket.AF_INET
    with _stdsocket.socket(family, _stdsocket.SOCK_DGRAM) as probe:
        try:
            probe.connect((dest, 9))
        except OSError as exc:
            raise UserError(f"no route to {dest}: {exc.strerror}; give a source address with -I", 1) from None
        return str(probe.getsockname()[0])


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def size_arg(text: str) -> int:
    """Message sizes: plain bytes or with a K/M suffix (1K = 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    if t.endswith("K"):
        mult, t = 1024, t[:-1]
    elif t.endswith("M"):
        mult, t = 1024 * 1024, t[:-1]
    try:
        value = int(t, 0) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if not 0 <= value <= 1 << 20:
        raise argparse.ArgumentTypeError(f"size must be 0..1M: {text!r}")
    return value


def die(message: str, code: int = 1) -> NoReturn:
    print(f"pyrds: {message}", file=sys.stderr)
    raise SystemExit(code)
