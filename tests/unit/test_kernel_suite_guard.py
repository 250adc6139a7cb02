"""Every test of tests/kernel runs under the plugin's hang guard (--rds-timeout): they use no plugin fixture,
so tests/kernel/conftest.py marks them; a hung AF_RDS call must fail its test, not stall the guest run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
from pyrds.testing.plugin import timeout_for

def pytest_collection_finish(session):
    for item in session.items:
        print("GUARD", timeout_for(item), item.nodeid)
"""


def test_every_kernel_test_has_the_hang_guard(tmp_path: Path) -> None:
    (tmp_path / "guard_probe.py").write_text(PROBE)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "guard_probe",
            "--rds-timeout",
            "77",
            "-p",
            "no:cacheprovider",
            "tests/kernel",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    rows = [line.split(maxsplit=2) for line in proc.stdout.splitlines() if line.startswith("GUARD ")]
    assert len(rows) > 20, proc.stdout + proc.stderr
    unguarded = [nodeid for _, limit, nodeid in rows if float(limit) != 77.0]
    assert not unguarded, unguarded
