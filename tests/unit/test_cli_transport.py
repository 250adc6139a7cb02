"""``pyrds stress --transport tcp|ib``: the option's parsing and the SO_RDS_TRANSPORT pin before bind, with
fake sockets (no stack, no AF_RDS); RDS/IB itself is measured in a guest (benchmarks/run.py --sections ib)."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from pyrds.cli import common, stress
from pyrds.cli.common import UserError, pin_transport
from pyrds.cli.main import build_parser, main
from pyrds.constants import SOL_RDS, SockOpt, Transport


class FakeSocket:
    """Records setsockopt and bind; bind fails (the stress code stops there, before any traffic)."""

    backend = "fake"

    def __init__(self, pin_errno: int | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.pin_errno = pin_errno

    def setsockopt(self, level: int, opt: int, value: int) -> None:
        if level == SOL_RDS and opt == SockOpt.SO_RDS_TRANSPORT and self.pin_errno is not None:
            raise OSError(self.pin_errno, "refused")
        self.calls.append(("setsockopt", level, int(opt), value))

    def bind(self, addr: Any) -> None:
        self.calls.append(("bind", addr))
        raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

    def close(self) -> None:
        self.calls.append(("close",))


def parse(*argv: str) -> Any:
    return build_parser().parse_args(["stress", *argv])


def test_transport_option_parses() -> None:
    assert parse().transport is None
    assert parse("--transport", "ib").transport == "ib"
    assert parse("--transport", "tcp").transport == "tcp"


def test_transport_option_rejects_other_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stress", "--transport", "iwarp"]) == 2
    err = capsys.readouterr().err
    assert "pyrds stress: argument --transport: invalid choice: 'iwarp'" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name,value", [("ib", Transport.IB), ("tcp", Transport.TCP)])
def test_pin_sets_so_rds_transport(name: str, value: int) -> None:
    sock = FakeSocket()
    pin_transport(sock, name)  # type: ignore[arg-type]
    assert sock.calls == [("setsockopt", SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(value))]
    assert type(sock.calls[0][3]) is int  # a plain int: the stdlib socket of benchmarks/stdlib_stress.py


def test_no_transport_sets_nothing() -> None:
    sock = FakeSocket()
    pin_transport(sock, None)  # type: ignore[arg-type]
    assert sock.calls == []


@pytest.mark.parametrize(
    "code,hint",
    [
        (errno.ENOPROTOOPT, "rds_rdma"),
        (errno.EPROTOTYPE, "initial network namespace"),
        (errno.EINVAL, "[EINVAL]"),
    ],
)
def test_pin_failure_is_a_user_error(code: int, hint: str) -> None:
    with pytest.raises(UserError) as info:
        pin_transport(FakeSocket(code), "ib")  # type: ignore[arg-type]
    assert info.value.code == 1
    assert str(info.value).startswith("cannot pin the socket to IB: ")
    assert hint in str(info.value)


@pytest.mark.parametrize("side", ["active", "passive"])
@pytest.mark.parametrize("transport", [None, "tcp", "ib"])
def test_stress_pins_before_bind(monkeypatch: pytest.MonkeyPatch, side: str, transport: str | None) -> None:
    made: list[FakeSocket] = []

    def fake_open(backend: str) -> FakeSocket:
        made.append(FakeSocket())
        return made[-1]

    monkeypatch.setattr(stress, "open_socket", fake_open)
    argv = ["-s", "10.98.0.1", "-T", "1", "--sockbuf", "0"]
    argv += ["--passive", "-p", "4001"] if side == "passive" else ["-r", "10.98.0.2"]
    if transport:
        argv += ["--transport", transport]
    args = parse(*argv)
    with pytest.raises(UserError) as info:
        args.func(args)
    assert "cannot bind to 10.98.0.1" in str(info.value)
    assert ("a socket pinned to RDS/IB binds" in str(info.value)) == (transport == "ib")
    (sock,) = made
    pins = [c for c in sock.calls if c[0] == "setsockopt"]
    binds = [i for i, c in enumerate(sock.calls) if c[0] == "bind"]
    if transport is None:
        assert pins == []
    else:
        value = int(common.TRANSPORTS[transport])
        assert pins == [("setsockopt", SOL_RDS, SockOpt.SO_RDS_TRANSPORT, value)]
        assert sock.calls.index(pins[0]) < binds[0]


def test_summary_names_the_pinned_transport() -> None:
    fields: dict[str, Any] = {
        "backend": "kernel",
        "mode": "rr",
        "size": 1024,
        "ack_size": 0,
        "depth": 1,
        "tasks": 1,
        "local": "10.98.0.1",
        "peer": "10.98.0.2",
        "port": 4000,
        "seconds": 1.0,
        "messages": 10,
        "msgs_per_s": 10.0,
        "mb_per_s": 0.01,
        "rtt_us": None,
        "cpu_pct": 5.0,
        "errors": [],
    }
    assert "(kernel backend, rr) ---" in stress.Summary(**fields).text()
    pinned = stress.Summary(**fields, transport="ib")
    assert "(kernel backend, rr, pinned to IB) ---" in pinned.text()
    assert pinned.as_dict()["transport"] == "ib"
