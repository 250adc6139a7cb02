"""benchmarks/wakeup_cost.py: every size gets its three rows, each with CPU and wall time per message, and
the ping-pong really alternates two processes (a reply per message)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.benchlib import bench_modules

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "wakeup_cost.py"


def test_three_ways_per_size_in_the_json_line() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", "0,300", "--messages", "200"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("PYRDS-WAKEUP-JSON ")]
    rows = json.loads(line[-1].split(" ", 1)[1])
    assert [(r["work"], r["way"]) for r in rows] == [
        (0, "alone"),
        (0, "pingpong"),
        (0, "syscalls"),
        (300, "alone"),
        (300, "pingpong"),
        (300, "syscalls"),
    ]
    assert all(r["wall_us"] > 0 and r["pages"] == 0 for r in rows)


def test_each_page_count_gets_every_size_and_way() -> None:
    args = ["--work", "10", "--pages", "0,64", "--messages", "100"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("PYRDS-WAKEUP-JSON ")][-1]
    rows = json.loads(line.split(" ", 1)[1])
    assert [(r["pages"], r["way"]) for r in rows] == [
        (0, "alone"),
        (0, "pingpong"),
        (0, "syscalls"),
        (64, "alone"),
        (64, "pingpong"),
        (64, "syscalls"),
    ]


def test_touch_writes_one_byte_in_each_page() -> None:
    with bench_modules(["wakeup_cost"]) as mods:
        mod = mods["wakeup_cost"]
        memory = bytearray(4 * mod.PAGE)
        mod.touch(memory, 3)
    assert [memory[i * 4096] for i in range(4)] == [1, 1, 1, 0]
    assert sum(memory) == 3


def test_pingpong_gets_a_reply_per_message() -> None:
    """Every message of the ping-pong waits for the other process's reply (one switch each way)."""
    with bench_modules(["wakeup_cost"]) as mods:
        row = mods["wakeup_cost"].pingpong(10, 50)
    assert row["replies"] == 50


@pytest.mark.parametrize(
    "args",
    [
        ["--work", "x"],
        ["--work", "-1"],
        ["--messages", "0"],
        ["--pages", "x"],
        ["--pages", "-1"],
        ["--code", "x"],
        ["--code", "-1"],
        ["--code", "5001"],
        ["--mypyc", "/nonexistent/mypyc"],
        ["--code-dir", "/nonexistent/dir"],
    ],
)
def test_bad_arguments_are_refused(args: list[str]) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "error" in res.stderr


def _rows(out: str) -> list[dict[str, object]]:
    line = [ln for ln in out.splitlines() if ln.startswith("PYRDS-WAKEUP-JSON ")][-1]
    rows: list[dict[str, object]] = json.loads(line.split(" ", 1)[1])
    return rows


def test_code_rows_follow_the_plain_ones() -> None:
    """--code: each count gets every way, the generated functions run in both processes of the ping-pong."""
    args = ["--work", "0", "--code", "0,3", "--messages", "50"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    rows = _rows(out)
    assert [(r["code"], r["impl"], r["way"]) for r in rows] == [
        (0, "interp", "alone"),
        (0, "interp", "pingpong"),
        (0, "interp", "syscalls"),
        (3, "interp", "alone"),
        (3, "interp", "pingpong"),
        (3, "interp", "syscalls"),
    ]
    assert rows[4]["replies"] == 50


def test_generated_module_calls_each_function_once(tmp_path: Path) -> None:
    with bench_modules(["wakeup_cost"]) as mods:
        mod = mods["wakeup_cost"]
        src = mod.code_source(4)
        assert [f"def f{i}(" in src for i in range(5)] == [True] * 4 + [False]
        assert src.count("acc = f") == 4
        code = mod.code_module(4, tmp_path)
        calls: list[int] = []
        for i in range(4):  # every generated function is on run's path, once
            real = getattr(code, f"f{i}")
            setattr(code, f"f{i}", lambda s, x, real=real, i=i: (calls.append(i), real(s, x))[1])
        first = code.run(code.State(), 1)
        assert calls == [0, 1, 2, 3]
        assert isinstance(first, int) and first == code.run(code.State(), 1)  # deterministic


def test_generated_source_is_reused_when_unchanged(tmp_path: Path) -> None:
    """A directory that already holds the same source is only read (a read-only one serves a guest)."""
    with bench_modules(["wakeup_cost"]) as mods:
        mod = mods["wakeup_cost"]
        path = tmp_path / "wakeup_code_2.py"
        path.write_text(mod.code_source(2))
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        code = mod.code_module(2, tmp_path)
        assert code.run(code.State(), 1) >= 0
        assert path.stat().st_mtime_ns == 1_000_000_000  # read, not written again
        stale = tmp_path / "wakeup_code_3.py"
        stale.write_text("raise SystemExit('stale')\n")
        assert mod.code_module(3, tmp_path).__file__ == str(stale)
        assert stale.read_text() == mod.code_source(3)


def _fake_mypyc(tmp_path: Path, body: str) -> str:
    tool = tmp_path / "fake-mypyc"
    tool.write_text("#!/bin/sh\n" + body + "\n")
    tool.chmod(0o755)
    return str(tool)


def test_a_failing_or_ineffective_mypyc_is_an_error_not_interpreted_rows(tmp_path: Path) -> None:
    """rows called mypyc must be compiled code: a build that fails, or leaves no extension, says so."""
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    with bench_modules(["wakeup_cost"]) as mods:
        mod = mods["wakeup_cost"]
        with pytest.raises(RuntimeError, match="mypyc failed"):
            mod.code_module(5, tmp_path / "d1", _fake_mypyc(tmp_path, "echo broken; exit 1"))
        with pytest.raises(RuntimeError, match="not imported compiled"):
            mod.code_module(6, tmp_path / "d2", _fake_mypyc(tmp_path, "exit 0"))
    args = ["--work", "0", "--code", "2", "--messages", "5", "--mypyc", _fake_mypyc(tmp_path, "exit 1")]
    res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "mypyc failed" in res.stderr and "PYRDS-WAKEUP-JSON" not in res.stdout


@pytest.mark.skipif(shutil.which("mypyc") is None or shutil.which("cc") is None, reason="needs mypyc and cc")
def test_mypyc_rows_run_the_compiled_module(tmp_path: Path) -> None:
    args = ["--work", "0", "--code", "3", "--messages", "20", "--mypyc", "mypyc", "--code-dir", str(tmp_path)]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, check=True
    ).stdout
    rows = _rows(out)
    assert [r["impl"] for r in rows] == ["interp"] * 3 + ["mypyc"] * 3
    assert list(tmp_path.glob("wakeup_code_3_mypyc.*.so"))
