"""The Python the guest runs CMD with.

Choice: a venv over Debian's ``/usr/bin/python3`` (3.11.2) created with ``--system-site-packages``, so it
imports Debian's ``pyverbs`` (python3-pyverbs, built against Debian's rdma-core 44 libraries: PyPI's pyverbs
needs rdma-core 59 and does not work here), plus pip-installed pytest, pytest-xdist, hypothesis and pyroute2
(the venv's site-packages come first, so these shadow Debian's older copies). The venv lives on the host in
``~/.cache/pyrds/guest-venv`` and the guest sees it through the read-only 9p root. The project itself is not
installed: the guest gets ``PYTHONPATH=<repo>``.

Any other CPython 3.11 works in the guest too (the host's pyenv 3.11.7, a tox env's ``{envpython}``): the
guest's PYTHONPATH also carries a "pyverbs shim", a directory holding only a symlink to Debian's
``/usr/lib/python3/dist-packages/pyverbs`` (same cpython-311 ABI). Putting all of dist-packages on PYTHONPATH
instead would shadow pyenv's newer pytest/hypothesis/pyroute2 with Debian's older copies. Without the venv
(e.g. no PyPI access), ``python3`` in the guest is plain ``/usr/bin/python3`` (Debian pytest 7.2, no xdist).
"""

from __future__ import annotations

import os
import subprocess
import sys

from vm.paths import cache_dir

SYSTEM_PYTHON = "/usr/bin/python3"
VENV_PACKAGES = ("pytest>=8", "pytest-xdist", "hypothesis>=6.100", "pyroute2>=0.9")


DEBIAN_PYVERBS = "/usr/lib/python3/dist-packages/pyverbs"


def pyverbs_shim() -> str | None:
    """A directory containing only ``pyverbs`` -> Debian's copy (for PYTHONPATH); None without pyverbs."""
    if not os.path.isdir(DEBIAN_PYVERBS):
        return None
    shim = os.path.join(cache_dir(), "pyverbs-shim")
    link = os.path.join(shim, "pyverbs")
    if os.path.realpath(link) != os.path.realpath(DEBIAN_PYVERBS):
        os.makedirs(shim, exist_ok=True)
        tmp = link + f".tmp{os.getpid()}"
        os.symlink(DEBIAN_PYVERBS, tmp)
        os.replace(tmp, link)
    return shim


def venv_dir() -> str:
    return os.path.join(cache_dir(), "guest-venv")


def venv_ok(path: str | None = None) -> bool:
    py = os.path.join(path or venv_dir(), "bin", "python3")
    if not os.path.exists(py):
        return False
    probe = "import pytest, xdist, hypothesis, pyroute2"
    return subprocess.run([py, "-c", probe], capture_output=True, timeout=60, check=False).returncode == 0


def ensure_venv(*, create: bool = True, log: bool = True) -> str | None:
    """Bin directory of the guest venv (created if missing and ``create``); None when unavailable."""
    path = venv_dir()
    if venv_ok(path):
        return os.path.join(path, "bin")
    if not create:
        return None
    if not os.path.exists(SYSTEM_PYTHON):
        if log:
            print(f"[vm] {SYSTEM_PYTHON} missing: apt-get install python3 python3-venv", file=sys.stderr)
        return None
    if log:
        print(f"[vm] creating guest venv {path} (one time)", file=sys.stderr)
    steps = [
        [SYSTEM_PYTHON, "-m", "venv", "--clear", "--system-site-packages", path],
        [os.path.join(path, "bin", "pip"), "install", "-q", "-U", *VENV_PACKAGES],
    ]
    for argv in steps:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if res.returncode != 0:
            if log:
                print(
                    f"[vm] guest venv setup failed ({' '.join(argv[:4])}...): {res.stderr.strip()[-400:]}; "
                    f"falling back to {SYSTEM_PYTHON} (apt-get install python3-venv?)",
                    file=sys.stderr,
                )
            return None
    return os.path.join(path, "bin") if venv_ok(path) else None
