"""The RDS/IB protocol core is sans-IO: no pyverbs, sockets, threads, clocks or logging in its modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pyrds.userspace.transports.ib as ib_pkg

IB_DIR = Path(ib_pkg.__file__).parent
SANS_IO = ("__init__", "wire", "privdata", "frag", "reasm", "events", "engine")
BANNED = {
    "pyverbs",
    "socket",
    "selectors",
    "select",
    "threading",
    "subprocess",
    "os",
    "time",
    "logging",
    "asyncio",
}


def top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_ib_core_imports_nothing_that_does_io() -> None:
    found = {m: top_level_imports(IB_DIR / f"{m}.py") & BANNED for m in SANS_IO}
    assert {m: s for m, s in found.items() if s} == {}


def test_the_check_sees_a_banned_import(tmp_path: Path) -> None:
    bad = tmp_path / "engine.py"
    bad.write_text("def f():\n    from pyverbs.qp import QP\n")
    assert top_level_imports(bad) & BANNED == {"pyverbs"}
