"""The README's python blocks run as written (userspace backend on this host).

Every ```python block is preceded by ``<!-- readme-test: NAME [needs=kernel] [kind=pytest] -->``; a block
without one fails ``test_every_python_block_is_named``, so none is silently left out. ``needs=kernel`` blocks
are SKIPPED with the reason where there is no AF_RDS (never counted as passed); ``kind=pytest`` blocks are
test files run by pytest with the pyrds plugin."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyrds

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = re.compile(
    r"<!-- readme-test: (?P<name>[\w-]+)(?P<opts>(?: \w+=\w+)*) -->\n```python\n(?P<code>.*?)```", re.S
)
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def blocks() -> dict[str, tuple[dict[str, str], str]]:
    text = README.read_text()
    found: dict[str, tuple[dict[str, str], str]] = {}
    for m in MARK.finditer(text):
        opts = dict(o.split("=") for o in m["opts"].split())
        assert m["name"] not in found, f"two README blocks named {m['name']}"
        found[m["name"]] = (opts, m["code"])
    return found


BLOCKS = blocks()


def test_every_python_block_is_named() -> None:
    text = README.read_text()
    assert text.count("```python\n") == len(BLOCKS) >= 5
    assert {o.get("needs") for o, _ in BLOCKS.values()} <= {None, "kernel"}
    assert {o.get("kind") for o, _ in BLOCKS.values()} <= {None, "pytest"}


def test_install_lines_are_documented() -> None:
    text = README.read_text()
    assert "    pip install ./            # or, to work on pyrds itself: pip install -e .\n" in text
    assert "pip install -e . --config-settings editable_mode=strict" in text
    assert "**`linux-rds`**" in text
    # the two fresh-machine commands stay exactly as CI runs them
    assert "\n    .ci/setup && tox -e conformance\n" in text
    assert "\n    .ci/setup && tox -e lint,py,vm\n" in text


def _needs(opts: dict[str, str]) -> None:
    if opts.get("needs") == "kernel" and not pyrds.kernel_available():
        pytest.skip("README block needs the kernel backend: AF_RDS is not available here (runs in the VM)")


@pytest.mark.parametrize("name", list(BLOCKS))
def test_readme_block(name: str, tmp_path: Path) -> None:
    opts, code = BLOCKS[name]
    _needs(opts)
    if opts.get("kind") == "pytest":
        (tmp_path / "test_from_readme.py").write_text(code)
        env = {**ENV, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "pyrds.testing.plugin",
                "-p",
                "no:cacheprovider",
                "-rA",
                "-q",
            ]
            + ["test_from_readme.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "PASSED test_from_readme.py::test_roundtrip[userspace]" in proc.stdout, proc.stdout
        if pyrds.kernel_available():
            assert "PASSED test_from_readme.py::test_roundtrip[kernel]" in proc.stdout, proc.stdout
        else:
            assert "SKIPPED [1] test_from_readme.py" in proc.stdout, proc.stdout  # a skip, not a pass
        return
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.strip(), proc.stdout + proc.stderr


def test_userspace_example_prints_what_the_comment_says(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKS["userspace-example"][1]],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert re.fullmatch(r"\(b'hello', \('127\.0\.0\.1', \d+\)\)\n", proc.stdout), proc.stdout + proc.stderr


@pytest.mark.skipif(pyrds.kernel_available(), reason="AF_RDS is available: the kernel block runs here")
def test_a_kernel_block_is_reported_as_skipped_not_passed() -> None:
    """Run this file's kernel block through pytest: the outcome is 'skipped' with the reason, zero passed."""
    env = {**ENV, "PYTEST_ADDOPTS": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", "-q"]
        + [f"{Path(__file__)}::test_readme_block[kernel-example]"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "passed" not in proc.stdout, proc.stdout
    assert "needs the kernel backend" in proc.stdout


@pytest.mark.skipif(
    os.environ.get("PYRDS_TEST_INSTALL") != "1",
    reason="installs into a fresh venv (pip fetches setuptools): set PYRDS_TEST_INSTALL=1",
)
def test_fresh_venv_install_and_mypy_strict_on_a_user_script(tmp_path: Path) -> None:
    """The README's install lines in a fresh venv: ``pip install ./`` gives the ``pyrds`` command and the
    userspace example; a strict editable install lets ``mypy --strict`` type-check a user script (the
    default editable install, an import hook, does not)."""
    import shutil
    import venv

    src = tmp_path / "src"
    shutil.copytree(ROOT / "pyrds", src / "pyrds", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}

    def run(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=cwd, env=clean, capture_output=True, text=True, timeout=600)

    done = run(str(py), "-m", "pip", "install", "-q", "./", cwd=src)
    assert done.returncode == 0, done.stderr
    version = run(str(env_dir / "bin" / "pyrds"), "--version")
    assert version.stdout.startswith("pyrds 0"), version.stdout + version.stderr
    example = run(str(py), "-c", BLOCKS["userspace-example"][1])
    assert example.returncode == 0 and "b'hello'" in example.stdout, example.stderr
    script = tmp_path / "user_script.py"
    script.write_text(
        "import pyrds\nfrom pyrds import InfoType\n\nwith pyrds.socket() as s:\n"
        "    s.bind(('127.0.0.1', 0))\n"
        "    print(sum(c.value for c in s.get_info(InfoType.RDS_INFO_COUNTERS)))\n"
    )
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", str(py)]
    done = run(str(py), "-m", "pip", "install", "-q", "-e", ".", cwd=src)
    assert done.returncode == 0, done.stderr
    hook = run(*mypy, str(script))
    assert hook.returncode == 1 and 'module named "pyrds"' in hook.stdout, hook.stdout  # the known limitation
    done = run(
        str(py), "-m", "pip", "install", "-q", "-e", ".", "--config-settings", "editable_mode=strict", cwd=src
    )
    assert done.returncode == 0, done.stderr
    strict = run(*mypy, str(script))
    assert strict.returncode == 0, strict.stdout + strict.stderr
