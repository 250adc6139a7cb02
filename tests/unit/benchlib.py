"""Importing benchmarks/ modules in host tests: they import each other as top-level modules (run.py puts its
directory on sys.path), so a test puts that directory on sys.path for as long as it needs them and restores
sys.modules afterwards (another test may have imported a module of the same name)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def bench_modules(names: Iterable[str], touched: Iterable[str] = ()) -> Iterator[dict[str, ModuleType]]:
    """``names`` imported from benchmarks/; those and ``touched`` (modules they import) restored after."""
    names = tuple(names)
    before = {name: sys.modules.get(name) for name in (*names, *touched)}
    sys.path.insert(0, str(BENCH))
    try:
        yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(BENCH))
        for name, mod in before.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
