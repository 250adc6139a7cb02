"""Precise types for users: ``mypy --strict`` on a user script sees typed addresses, typed RDS_INFO records
and the two ``sendto`` forms, and refuses ``sendto(b"x", "127.0.0.1")`` (``sendto`` took ``*args: Any``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GOOD = textwrap.dedent(
    """
    import asyncio

    import pyrds
    from pyrds import InfoType
    from pyrds.aio import AsyncRDSSocket

    with pyrds.socket("userspace") as s:
        s.bind(("127.0.0.1", 0))
        s.sendto(b"x", ("127.0.0.1", 4000))
        s.sendto(b"x", 0, ("::1", 4000, 0, 0))
        data, addr = s.recvfrom(100)
        reveal_type(addr)
        buf = bytearray(10)
        reveal_type(s.recv_into(buf))
        for c in s.get_info(InfoType.RDS_INFO_COUNTERS):
            reveal_type(c)
        for k in s.get_info(InfoType.RDS6_INFO_SOCKETS):
            reveal_type(k)
        reveal_type(s.type)
        reveal_type(s.dup())


    async def main() -> bytes:
        a = AsyncRDSSocket(pyrds.socket())
        await a.sendto(b"y", ("127.0.0.1", 4000))
        return await a.recv(10)


    print(pyrds.__version__ + "", asyncio.run(main()))
    """
)

BAD = textwrap.dedent(
    """
    import pyrds

    s = pyrds.socket()
    s.sendto(b"x", "127.0.0.1")
    s.sendto(b"x", ("127.0.0.1", "4000"))
    s.recv_into(b"read-only")
    """
)


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    api = pytest.importorskip("mypy.api")
    script = tmp_path / "user_script.py"
    script.write_text(source)
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy_cache"), str(script)]
    )
    return out + err, status


def test_user_script_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # pyrds as the checkout provides it (the installed one may be an import hook)
    out, status = _mypy(tmp_path, GOOD)
    notes = [
        ln.split("Revealed type is ")[1].strip('"').replace("builtins.", "")
        for ln in out.splitlines()
        if "Revealed type" in ln
    ]
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert errors == [], out
    assert notes == [
        "tuple[str, int] | tuple[str, int, int, int]",
        "int",
        "pyrds.info.InfoCounter",
        "pyrds.info.Socket6Info",
        "socket.SocketKind",
        "pyrds.api.RDSSocketBase",
    ], out
    assert status in (0, 1)  # (older mypy counts reveal_type notes in the exit status)


def test_bad_calls_are_type_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    out, status = _mypy(tmp_path, BAD)
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert status == 1
    lines = sorted({int(ln.split(":")[1]) for ln in errors})
    assert lines == [5, 6, 7], out
