"""Process start-up stays cheap: every CLI call, stack service and test agent imports pyrds, and in a TCG
guest importlib.metadata costs ~1.5 s and pyroute2 ~12 s per process (measured 2026-11-23 on 7.3). Those are
imported only when used (``pyrds.__version__``, namespace set-up)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("importlib.metadata", "pyroute2")
ENTRY_POINTS = ["pyrds", "pyrds.cli.main", "pyrds.userspace.service", "pyrds.testing.agent", "pyrds.kernel"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_points_do_not_import_heavy_modules(module: str) -> None:
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "", f"importing {module} pulls in {out.strip()}"


def test_version_is_still_there_when_asked() -> None:
    code = "import sys, pyrds; v = pyrds.__version__; print(v, 'importlib.metadata' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    version, loaded = out.split()
    assert version and loaded == "True"
