"""What an install of linux-rds holds: the wheel built from this tree carries the package, its type
information and, when a compiler and Python's headers are there, the built C data calls, but not the C
source (the sdist has it; setup.py builds from it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tracked files, so a build's own files never land in the checkout."""
    try:
        import setuptools  # noqa: F401
    except ImportError:
        pytest.skip("setuptools is not in this environment (the builds run without isolation)")
    src = tmp_path_factory.mktemp("tree")
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False, text=True
    )
    if files.returncode != 0:
        pytest.skip("not a git checkout")
    for name in filter(None, files.stdout.split("\0")):
        target = src / name
        if (ROOT / name).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
    return src


def _meets_build_requires() -> bool:
    """This environment has what pyproject.toml's build-system asks (setuptools>=68) and can make a wheel
    with it (bdist_wheel: in setuptools since 70.1, before that in the ``wheel`` package). A pyenv Python
    with setuptools 65 and no ``wheel`` does not: a build without isolation there failed with "invalid
    command 'bdist_wheel'"."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    try:
        parts = version("setuptools").split(".")
        have = (int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0)
    except (PackageNotFoundError, ValueError):
        return False
    return have >= (68, 0) and (have >= (70, 1) or find_spec("wheel") is not None)


def _build_isolation() -> list[str]:
    """Build with what is installed when it meets the build requirements (tox's environments do, and need
    no index then); otherwise let pip make an isolated build environment from them."""
    return ["--no-build-isolation"] if _meets_build_requires() else []


@pytest.fixture(scope="module")
def wheel_names(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            *_build_isolation(),
            "-w",
            str(out),
            str(tree),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = out.glob("linux_rds-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_the_wheel_has_the_package_and_its_types_but_not_the_c_source(wheel_names: list[str]) -> None:
    assert "pyrds/__init__.py" in wheel_names
    assert "pyrds/py.typed" in wheel_names
    assert "pyrds/kernel/_fastcall.pyi" in wheel_names
    assert "pyrds/kernel/socket.py" in wheel_names
    assert not [n for n in wheel_names if n.endswith(".c")]


def test_the_wheel_has_the_built_c_module_when_it_could_be_built(wheel_names: list[str]) -> None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if shutil.which("gcc") is None or not include.exists():
        pytest.skip("no compiler or no Python headers: the wheel is built without its C module")
    assert f"pyrds/kernel/_fastcall{suffix}" in wheel_names


def test_the_sdist_has_the_c_source(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("sdist")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    name = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout.split()[-1]
    with tarfile.open(out / name) as tf:
        names = tf.getnames()
    assert any(n.endswith("/pyrds/kernel/_fastcall.c") for n in names), names
    assert any(n.endswith("/setup.py") for n in names), names
