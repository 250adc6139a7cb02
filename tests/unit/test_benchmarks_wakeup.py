"""benchmarks/wakeup_cost.py: every size gets its three rows, each with CPU and wall time per message, and
the ping-pong really alternates two processes (a reply per message)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.benchlib import bench_modules

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "wakeup_cost.py"


def test_three_ways_per_size_in_the_json_line() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--work", "0,300", "--messages", "200"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("PYRDS-WAKEUP-JSON ")]
    rows = json.loads(line[-1].split(" ", 1)[1])
    assert [(r["work"], r["way"]) for r in rows] == [
        (0, "alone"), (0, "pingpong"), (0, "syscalls"), (300, "alone"), (300, "pingpong"), (300, "syscalls")
    ]
    assert all(r["wall_us"] > 0 and r["pages"] == 0 for r in rows)


def test_each_page_count_gets_every_size_and_way() -> None:
    args = ["--work", "10", "--pages", "0,64", "--messages", "100"]
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("PYRDS-WAKEUP-JSON ")][-1]
    rows = json.loads(line.split(" ", 1)[1])
    assert [(r["pages"], r["way"]) for r in rows] == [
        (0, "alone"), (0, "pingpong"), (0, "syscalls"), (64, "alone"), (64, "pingpong"), (64, "syscalls")
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
    "args", [["--work", "x"], ["--work", "-1"], ["--messages", "0"], ["--pages", "x"], ["--pages", "-1"]]
)
def test_bad_arguments_are_refused(args: list[str]) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "error" in res.stderr
