"""The pytest plugin's hang guard is armed only for pyrds tests (its fixtures or its markers): an unrelated
test of a project that has pyrds installed is never timed out by it. Each case runs pytest in a subprocess
on a throw-away project, with a guard of 0.5 s and tests that sleep 1.5 s."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROJECT = textwrap.dedent(
    """
    import time

    import pytest


    def test_unrelated_sleeps_past_the_guard():
        time.sleep(1.5)


    def test_unrelated_fixture_named_like_nothing(tmp_path):
        time.sleep(1.5)


    @pytest.mark.rds_timeout
    def test_marked():
        time.sleep(1.5)


    @pytest.mark.rds_timeout(5)
    def test_marked_with_own_limit():
        time.sleep(1.5)


    def test_uses_plugin_fixture(rds_observe):
        time.sleep(1.5)
    """
)

EXPECTED = {
    "test_unrelated_sleeps_past_the_guard": "PASSED",
    "test_unrelated_fixture_named_like_nothing": "PASSED",
    "test_marked": "FAILED",
    "test_marked_with_own_limit": "PASSED",
    "test_uses_plugin_fixture": "FAILED",
}


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(ep.value == "pyrds.testing.plugin" for ep in eps)


def _run(tmp_path: Path, autoload: bool) -> dict[str, str]:
    (tmp_path / "test_other_project.py").write_text(PROJECT)
    env = dict(os.environ, PYRDS_TEST_TIMEOUT="0.5")
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    args = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=", "-rA"]
    if autoload:  # as a user's project sees it: the plugin comes from the installed entry point
        env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        args += ["-p", "no:xdist", "-p", "no:randomly"]
    else:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        args += ["-p", "pyrds.testing.plugin"]
    proc = subprocess.run(
        [*args, "test_other_project.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    outcomes: dict[str, str] = {}
    for line in out.splitlines():
        for name in EXPECTED:
            if line.startswith(f"test_other_project.py::{name} ") and line.split()[1] in ("PASSED", "FAILED"):
                outcomes[name] = line.split()[1]
    assert set(outcomes) == set(EXPECTED), out
    if "FAILED" in outcomes.values():
        assert "RdsTestTimeout" in out, out
    assert proc.returncode == 1, out  # the two pyrds tests fail, nothing else
    return outcomes


def test_plugin_module_times_only_pyrds_tests(tmp_path: Path) -> None:
    assert _run(tmp_path, autoload=False) == EXPECTED


@pytest.mark.skipif(not _entry_point_installed(), reason="pyrds is not installed (no pytest11 entry point)")
def test_installed_entry_point_times_only_pyrds_tests(tmp_path: Path) -> None:
    assert _run(tmp_path, autoload=True) == EXPECTED


def test_help_says_which_tests_are_timed(tmp_path: Path) -> None:
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pyrds.testing.plugin", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = " ".join(proc.stdout.split())
    assert "other tests are never timed by pyrds" in text, proc.stdout
    markers = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pyrds.testing.plugin", "--markers"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "@pytest.mark.rds_timeout(seconds=None)" in markers.stdout


COUNTED = textwrap.dedent(
    """
    import time


    def test_counted(rds_mainline_count):
        time.sleep(1.5)


    def test_rounds(rds_round):
        pass


    def test_scale(rds_mainline_count, rds_count_scale):
        print(f"scale={rds_count_scale!r}")


    def test_scale_other(rds_message_count, rds_count_scale):
        print(f"scale={rds_count_scale!r}")


    def test_scale_ib(rds_ib_selftest_count, rds_count_scale):
        print(f"ib count={rds_ib_selftest_count} scale={rds_count_scale!r}")
    """
)


def _run_counted(tmp_path: Path, *options: str) -> str:
    (tmp_path / "test_counted_project.py").write_text(COUNTED)
    env = dict(os.environ, PYRDS_TEST_TIMEOUT="0.5", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYRDS_ROUNDS", None)
    env.pop("PYRDS_MAINLINE_MESSAGES", None)
    env.pop("PYRDS_IB_SELFTEST_MESSAGES", None)
    args = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=", "-rA"]
    proc = subprocess.run(
        [*args, "-p", "pyrds.testing.plugin", *options, "test_counted_project.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout + proc.stderr


def test_the_hang_guard_grows_with_the_message_count(tmp_path: Path) -> None:
    # 0.5 s at the default 5000 messages: the 1.5 s test is failed; at 20000 messages the guard is 2 s
    out = _run_counted(tmp_path, "-k", "counted")
    assert "test_counted_project.py::test_counted FAILED" in out and "RdsTestTimeout" in out, out
    out = _run_counted(tmp_path, "-k", "counted", "--rds-mainline-messages", "20000")
    assert "test_counted_project.py::test_counted PASSED" in out, out


def test_a_scenario_scales_its_own_bound_as_the_guard_does(tmp_path: Path) -> None:
    out = _run_counted(tmp_path, "-k", "scale", "-s")
    assert out.count("scale=1.0") == 3 and "ib count=1000 scale=1.0" in out, out
    counts = ("--rds-mainline-messages", "50000", "--rds-messages", "3000")
    counts += ("--rds-ib-selftest-messages", "50000")
    out = _run_counted(tmp_path, "-k", "scale", "-s", *counts)
    assert "scale=10.0" in out and "scale=1.5" in out and "ib count=50000 scale=50.0" in out, out


def test_rounds_repeat_a_scenario_and_one_round_keeps_its_id(tmp_path: Path) -> None:
    out = _run_counted(tmp_path, "-k", "rounds")
    assert "test_counted_project.py::test_rounds PASSED" in out, out
    out = _run_counted(tmp_path, "-k", "rounds", "--rds-rounds", "3")
    for i in (1, 2, 3):
        assert f"test_counted_project.py::test_rounds[round{i}] PASSED" in out, out
    assert "round4" not in out
    out = _run_counted(tmp_path, "-k", "rounds", "--rds-rounds", "0")
    assert "--rds-rounds must be >= 1" in out, out
