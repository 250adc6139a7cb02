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


#: what each entry point must not load: the userspace client's socket class (and pyrds.info's ctypes
#: tables, which it brings) belongs to processes that open a userspace socket. Every ``pyrds`` command
#: built its parser through ``pyrds.cli.stack`` -> ``pyrds.userspace`` -> the client socket (1.8 s of
#: imports by a 7.3 guest profile; the whole ``pyrds info`` call gained 0.1-0.8 s when measured, see
#: tests/conformance/README.md); the stack service loaded it and never used it.
NOT_NEEDED = {
    "pyrds.cli.main": ("pyrds.userspace.client.socket", "pyrds.info"),
    "pyrds.userspace.rpc": ("pyrds.userspace.client.socket",),
    "pyrds.userspace.client.autostart": ("pyrds.userspace.client.socket",),
    "pyrds.userspace.service": ("pyrds.userspace.client.socket",),
}


@pytest.mark.parametrize("module", sorted(NOT_NEEDED))
def test_entry_points_load_only_what_they_use(module: str) -> None:
    unwanted = NOT_NEEDED[module]
    code = f"import sys, {module}; print(','.join(m for m in {unwanted!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "", f"importing {module} pulls in {out.strip()}"


def test_the_userspace_socket_class_is_still_reachable_from_the_package() -> None:
    code = (
        "import pyrds.userspace as u, pyrds.userspace.client as c; from pyrds.userspace import RDSSocket; "
        "print(u.RDSSocket is c.RDSSocket is RDSSocket, RDSSocket.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "pyrds.userspace.client"]
    argv = [sys.executable, "-c", "import pyrds.userspace as u; u.nothing"]
    proc = subprocess.run(argv, capture_output=True)
    assert proc.returncode == 1 and b"AttributeError" in proc.stderr
