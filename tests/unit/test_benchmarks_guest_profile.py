"""benchmarks/guest_profile.py: perf's rows become per-process shares split into user and kernel time, each
process's own top symbols (not perf's per-symbol rows, which mix processes), and roles from command lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.benchlib import bench_modules

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "guest_profile.py"

PID_DSO = """\
# Samples: 3K of event 'cpu-clock:pppH'
#
# Overhead      Pid:Command     Shared Object
# ........  ..................  ...................
#
    37.06%        0:swapper     [kernel.kallsyms]
    18.10%      223:python      python3.11
     4.33%      223:python      [kernel.kallsyms]
     0.15%      223:python      [vdso]
     7.00%      226:python      python3.11
     2.62%      226:python      [kernel.kallsyms]
"""

PID_SYM = """\
# Overhead      Pid:Command     Symbol
#
     8.99%      223:python      [.] _PyEval_EvalFrameDefault
     3.14%      226:python      [.] _PyEval_EvalFrameDefault
     0.54%      223:python      [.] _PyObject_Malloc
     0.44%      223:python      [k] finish_task_switch.isra.0
     0.39%      223:python      [.] tupledealloc
     0.20%      226:python      [k] do_syscall_64
"""


def test_processes_are_split_into_user_and_kernel_time() -> None:
    with bench_modules(["guest_profile"]) as mods:
        procs = mods["guest_profile"].parse_pid_dso(PID_DSO)
    assert procs[0] == {"comm": "swapper", "total": 37.06, "kernel": 37.06, "user": 0.0}
    assert procs[223] == {"comm": "python", "total": 22.58, "kernel": 4.33, "user": 18.25}
    assert procs[226] == {"comm": "python", "total": 9.62, "kernel": 2.62, "user": 7.0}


def test_each_process_gets_its_own_symbols_in_order() -> None:
    with bench_modules(["guest_profile"]) as mods:
        syms = mods["guest_profile"].parse_symbols(PID_SYM, 3)
    assert syms[223] == [
        (8.99, "u", "_PyEval_EvalFrameDefault"),
        (0.54, "u", "_PyObject_Malloc"),
        (0.44, "k", "finish_task_switch.isra.0"),
    ]
    assert syms[226] == [(3.14, "u", "_PyEval_EvalFrameDefault"), (0.2, "k", "do_syscall_64")]


@pytest.mark.parametrize(
    ("cmdline", "role"),
    [
        ("/venv/bin/python -m pyrds.userspace.service --shared --detach", "service"),
        ("/venv/bin/python /b/floor.py end userspace resp 10.0.0.2 10.0.0.1 0 26.0", "client"),
        ("/venv/bin/python /b/floor.py relay a connect 10.0.0.2 16390", "other"),
        ("perf record -a", "other"),
    ],
)
def test_roles_come_from_command_lines(cmdline: str, role: str) -> None:
    with bench_modules(["guest_profile"]) as mods:
        assert mods["guest_profile"].role_of(cmdline) == role


@pytest.mark.parametrize(
    "args",
    [
        ["--kinds", "relay"],
        ["--kinds", ""],
        ["-T", "10", "--warmup", "8", "--sample", "3"],
        ["--warmup", "0"],
        ["--top", "0"],
        ["--freq", "0"],
        ["-T", "x"],
    ],
)
def test_bad_arguments_are_refused(args: list[str]) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "error" in res.stderr


def test_no_perf_is_said_not_sampled(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 1 and "no perf" in res.stderr and "PYRDS-PROFILE-JSON" not in res.stdout


def test_a_failing_perf_report_is_an_error_not_an_empty_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    perf = tmp_path / "perf"
    perf.write_text("#!/bin/sh\necho 'no samples file' >&2\nexit 255\n")
    perf.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with bench_modules(["guest_profile"]) as mods, pytest.raises(RuntimeError, match="no samples file"):
        mods["guest_profile"]._report(tmp_path / "perf.data", "--sort", "pid")
