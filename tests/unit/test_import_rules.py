"""The house rules of pyrds' imports, checked on the source (no import is executed).

1. The userspace stack's rooms depend on each other in one direction only:
   proto <- stack <- transports <- service; the application side (client) uses only the shared wire format
   and configuration (rpc, config); transports are peers (loop, tcp and ib never import each other) and
   only the transports package itself names a transport's modules.
2. proto is sans-IO: of pyrds it uses only pyrds.constants, and no stdlib module that does I/O or keeps time.
3. No import cycle anywhere in pyrds/ (function-local and TYPE_CHECKING imports count too).

Every import statement counts, wherever it is written. ``tox -e lint`` runs this file; the two last tests feed
the checker a tree that breaks the rules, so a checker that sees nothing fails too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PYRDS = Path(__file__).resolve().parents[2] / "pyrds"
US = "pyrds.userspace"


@dataclass(frozen=True)
class Room:
    """Modules under ``prefix`` may import, of pyrds, only modules under one of ``may_import`` (their own
    room is always allowed); ``stdlib_banned``: top-level stdlib modules they must not use."""

    prefix: str
    may_import: tuple[str, ...]
    stdlib_banned: tuple[str, ...] = ()


#: the rooms of pyrds.userspace, most specific first (a module belongs to the first room whose prefix fits)
ROOMS: tuple[Room, ...] = (
    Room(
        f"{US}.proto",
        ("pyrds.constants",),
        stdlib_banned=("socket", "selectors", "select", "threading", "subprocess", "os", "time", "logging"),
    ),
    Room(f"{US}.config", ("pyrds.constants",)),
    Room(f"{US}.values", ()),  # the control connection's value encoding (no foreign byte reaches marshal)
    Room(f"{US}.rpc", (f"{US}.values",)),
    Room(
        f"{US}.stack",
        (f"{US}.proto", f"{US}.config", "pyrds.constants", "pyrds.addr", "pyrds.info", "pyrds.cmsg"),
    ),
    Room(f"{US}.transports.loop", (f"{US}.stack", f"{US}.config", "pyrds.constants", "pyrds.addr")),
    Room(
        f"{US}.transports.tcp",
        (f"{US}.stack", f"{US}.proto", f"{US}.config", "pyrds.constants", "pyrds.addr"),
    ),
    Room(  # RDS/IB: so far its sans-IO core only (no pyverbs); tests/unit/userspace/ib checks it does no I/O
        f"{US}.transports.ib",
        (f"{US}.stack", f"{US}.proto", f"{US}.config", "pyrds.constants", "pyrds.addr"),
    ),
    Room(
        f"{US}.transports",  # the package itself: the factories that name each transport
        (f"{US}.transports.loop", f"{US}.transports.tcp", f"{US}.stack"),
    ),
    Room(
        f"{US}.service",
        (
            f"{US}.transports",  # the factories only: see TRANSPORT_INTERNALS
            f"{US}.stack",
            f"{US}.proto",
            f"{US}.rpc",
            f"{US}.config",
            "pyrds.constants",
            "pyrds.addr",
        ),
    ),
    Room(
        f"{US}.client",
        (f"{US}.rpc", f"{US}.config", "pyrds.constants", "pyrds.addr", "pyrds.api", "pyrds.info"),
    ),
    Room(f"{US}.control", (f"{US}.client",)),
    Room(US, (f"{US}.client",)),  # pyrds/userspace/__init__.py
)
#: a transport's own modules: only its package (and the transports package's factories) may import them
TRANSPORT_INTERNALS = (f"{US}.transports.loop", f"{US}.transports.tcp", f"{US}.transports.ib")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``: dotted name -> file."""
    return {module_name(root, p): p for p in sorted(root.rglob("*.py"))}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement of ``path``: package modules are resolved to the
    module itself (``from pkg import sub`` -> ``pkg.sub``), anything else to its top-level name."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in modules else base), node.lineno


def graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same package: first line}."""
    modules = discover(root)
    top = root.name
    out: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(name, path, modules):
            if _within(target, top) and target in modules:
                edges.setdefault(target, line)
        out[name] = edges
    return out


def stdlib_imports(root: Path) -> dict[str, dict[str, int]]:
    """module -> {top-level name of a non-package import: line}."""
    modules = discover(root)
    out: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        out[name] = {}
        for target, line in imports_of(name, path, modules):
            head = target.split(".")[0]
            if head and head != root.name:
                out[name].setdefault(head, line)
    return out


def room_of(name: str, rooms: tuple[Room, ...]) -> Room | None:
    return next((r for r in rooms if _within(name, r.prefix)), None)


def rule_violations(root: Path, rooms: tuple[Room, ...] = ROOMS) -> list[str]:
    """Every import that breaks a room's rule, as ``module:line imports target (why)``."""
    found: list[str] = []
    edges = graph(root)
    for name, targets in edges.items():
        room = room_of(name, rooms)
        for target, line in targets.items():
            where = f"{name}:{line} imports {target}"
            if (
                _within(target, f"{US}.transports")
                and any(_within(target, t) for t in TRANSPORT_INTERNALS)
                and not _within(name, f"{US}.transports")
            ):
                found.append(f"{where} (a transport's internals: use pyrds.userspace.transports)")
                continue
            # transports are peers: a transport's package never imports another transport
            own = next((t for t in TRANSPORT_INTERNALS if _within(name, t)), None)
            other = next((t for t in TRANSPORT_INTERNALS if _within(target, t)), None)
            if own is not None and other is not None and own != other:
                found.append(f"{where} (transports are peers: {own} must not use {other})")
                continue
            if room is None:
                continue
            allowed = (room.prefix, *room.may_import)
            if not any(_within(target, a) for a in allowed):
                only = ", ".join(room.may_import) or "itself"
                found.append(f"{where} ({room.prefix} may import only {only})")
    for name, heads in stdlib_imports(root).items():
        room = room_of(name, rooms)
        for head, line in heads.items():
            if room is not None and head in room.stdlib_banned:
                found.append(f"{name}:{line} imports {head} ({room.prefix} does no I/O and keeps no time)")
    return found


def import_cycles(edges: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing itself): each is
    at least one import cycle. Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, {}):
                    cycles.append(sorted(component))
    return cycles


def test_userspace_rooms_follow_the_dependency_rule() -> None:
    assert rule_violations(PYRDS) == []


def test_no_import_cycle_in_pyrds() -> None:
    assert import_cycles(graph(PYRDS)) == []


def test_every_userspace_module_has_a_room() -> None:
    homeless = [m for m in discover(PYRDS) if _within(m, US) and room_of(m, ROOMS) is None]
    assert homeless == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pyrds"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return root


@pytest.mark.parametrize(
    ("rel", "text", "why"),
    [
        ("userspace/stack/core.py", "from pyrds.userspace.service import server\n", "userspace.stack may"),
        ("userspace/stack/core.py", "from pyrds.userspace import rpc\n", "pyrds.userspace.stack may"),
        ("userspace/proto/path.py", "def f():\n    from pyrds.userspace.stack import core\n", "proto"),
        ("userspace/proto/path.py", "import socket\n", "does no I/O"),
        ("userspace/client/socket.py", "from pyrds.userspace.stack.core import Stack\n", "client may"),
        ("userspace/transports/loop.py", "from pyrds.userspace.transports.tcp import conn\n", "peers"),
        ("userspace/service/server.py", "from pyrds.userspace.transports.tcp.conn import X\n", "internals"),
        ("cli/info.py", "from pyrds.userspace.transports.loop import LoopTransport\n", "internals"),
        ("userspace/transports/ib/engine.py", "from pyrds.userspace.transports.tcp import conn\n", "peers"),
        ("userspace/service/server.py", "from pyrds.userspace.transports.ib.engine import X\n", "internals"),
    ],
)
def test_the_rule_catches_a_violating_module(tmp_path: Path, rel: str, text: str, why: str) -> None:
    base = {
        "userspace/stack/core.py": "from pyrds.userspace.proto import path\n",
        "userspace/proto/path.py": "import struct\n",
        "userspace/client/socket.py": "from pyrds.userspace import rpc\n",
        "userspace/transports/loop.py": "from pyrds.userspace.stack import core\n",
        "userspace/transports/tcp/conn.py": "from pyrds.userspace.stack import core\n",
        "userspace/transports/ib/engine.py": "from pyrds.userspace.proto import path\n",
        "userspace/service/server.py": "from pyrds.userspace.transports import loop_transport\n",
        "userspace/rpc.py": "import struct\n",
        "cli/info.py": "from pyrds.userspace.client import socket\n",
    }
    assert rule_violations(_tree(tmp_path / "ok", base)) == []
    bad = rule_violations(_tree(tmp_path / "bad", {**base, rel: text}))
    assert len(bad) == 1 and why in bad[0], bad


def test_the_cycle_check_catches_a_cycle(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "a.py": "from pyrds import b\n",
            "b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pyrds.c import C\n",
            "c.py": "def f():\n    from pyrds.a import A\n",
            "d.py": "from pyrds import a\n",
        },
    )
    assert import_cycles(graph(root)) == [["pyrds.a", "pyrds.b", "pyrds.c"]]
