"""Version, ``python -m pyrds``, one-line usage errors, ``pyrds info`` without a stack, and the stress
summary's cpu figure (issue 13)."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import pyrds
from tests.unit.test_cli import CLI, ENV, ROOT, _can_netns, assert_no_traceback, free_port, pyrds_cmd

PYRDS_M = [sys.executable, "-m", "pyrds"]


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("linux-rds")
    except importlib.metadata.PackageNotFoundError:
        return None


def test_version_from_metadata() -> None:
    expected = _installed_version() or "0+unknown"
    assert pyrds.__version__ == expected
    assert "__version__" in pyrds.__all__


def test_version_fallback_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert pyrds._version() == "0+unknown"


@pytest.mark.parametrize("argv", [CLI, PYRDS_M], ids=["cli-main", "python-m-pyrds"])
def test_version_option(argv: list[str]) -> None:
    for flag in ("--version", "-V"):
        proc = subprocess.run([*argv, flag], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"pyrds {pyrds.__version__} (linux-rds)"


def test_cli_does_not_look_up_the_version_unless_asked() -> None:
    """importlib.metadata costs ~1.5 s per process in a TCG guest and the conformance suite starts dozens of
    ``pyrds`` processes: building the parser and running a subcommand must not import it."""
    code = (
        "import sys; from pyrds.cli.main import build_parser; build_parser().parse_args(['info', '-n']); "
        "print('importlib.metadata' in sys.modules)"
    )
    argv = [sys.executable, "-S", "-c", code]  # -S: no site, no editable-install finder importing it
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_python_m_pyrds_runs_the_cli() -> None:
    proc = subprocess.run([*PYRDS_M, "--help"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and "{ping,info,stress,stack}" in proc.stdout
    proc = subprocess.run(
        [*PYRDS_M, "info", "-h"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: pyrds info")


@pytest.mark.parametrize(
    "args,expect",
    [
        (["info", "-x"], "pyrds info: unrecognized arguments: -x"),
        (["info", "--backend", "userspace", "-c", "extra"], "pyrds info: unrecognized arguments: extra"),
        (["stress", "-T", "0", "-r", "127.0.0.1"], "pyrds stress: argument -T/--duration: must be a number"),
        (["stress", "-T", "-1"], "pyrds stress: argument -T/--duration: must be a number"),
        (["stress", "-T", "nan"], "pyrds stress: argument -T/--duration: must be a number"),
        (["stress", "-T", "soon"], "pyrds stress: argument -T/--duration: not a number"),
        (["stress", "-d", "0"], "pyrds stress: argument -d/--depth: must be >= 1"),
        (["ping", "-c", "x", "127.0.0.1"], "pyrds ping: argument -c"),
        (["ping"], "pyrds ping: the following arguments are required"),
        (["bogus"], "pyrds: argument {ping,info,stress,stack}: invalid choice: 'bogus'"),
        ([], "pyrds: the following arguments are required"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], expect: str) -> None:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert_no_traceback(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # no usage dump of the top-level parser
    assert lines[0].startswith(expect), proc.stderr
    assert "usage:" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.netns
@pytest.mark.skipif(_can_netns() is not None, reason=str(_can_netns()))
def test_info_does_not_start_a_stack() -> None:
    """In a namespace with no userspace stack, ``pyrds info`` prints an idle stack's tables, says on stderr
    that none runs, and leaves no service behind (before: it started one, with its TCP listener)."""
    import json

    from pyrds.netns import create_netns, delete_netns, netns_pids, run_in_netns, unique_name
    from tests.unit.test_cli import run_captured

    ns = unique_name("cliinfo")
    create_netns(ns)
    try:
        done = run_captured([*CLI, "info", "--backend", "userspace", "--json"], 60, ns)
        text = run_captured([*CLI, "info", "--backend", "userspace", "-c", "-k"], 60, ns)
        time.sleep(0.5)
        pids = netns_pids(ns)

        def running() -> bool:
            from pyrds.cli.info import userspace_stack_running

            return userspace_stack_running()

        alive = run_in_netns(ns, running)
    finally:
        for pid in netns_pids(ns):
            os.kill(pid, signal.SIGTERM)
        delete_netns(ns)
    assert done.returncode == 0, done.stderr
    assert "no pyrds userspace stack runs in this network namespace" in done.stderr
    doc = json.loads(done.stdout)
    assert doc["backend"] == "userspace"
    assert doc["counters"] and all(c["value"] == 0 for c in doc["counters"])
    assert doc["sockets"] == [] and doc["connections"] == []
    assert text.returncode == 0 and "Counters:" in text.stdout and "RDS Sockets:" in text.stdout
    assert not alive and pids == [], pids


def test_info_with_a_running_stack_reads_it() -> None:
    sock = pyrds.socket("userspace")  # a stack runs in this namespace while this socket is open
    try:
        sock.bind(("127.0.0.1", 0))
        proc = pyrds_cmd("info", "--backend", "userspace", "-k", "--json")
    finally:
        sock.close()
    assert proc.returncode == 0, proc.stderr
    assert "no pyrds userspace stack" not in proc.stderr
    assert '"sockets"' in proc.stdout and "127.0.0.1" in proc.stdout


def _rows_cpu(text: str) -> list[float]:
    rows = [ln.split() for ln in text.replace("\r", "\n").splitlines()]
    return [float(r[4]) for r in rows if len(r) == 5 and r[0][0].isdigit()]


def test_stress_summary_cpu_after_ctrl_c_matches_rows() -> None:
    """Ctrl-C used to report cpu 0 % while the rows showed the process busy; now the summary's cpu % is the
    run's average over the same span as the rows."""
    port = free_port()
    server = subprocess.Popen(
        [*CLI, "stress", "--passive", "--backend", "userspace", "-s", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    try:
        assert server.stdout is not None
        assert "passive on" in server.stdout.readline()
        client = subprocess.Popen(
            [*CLI, "stress", "--backend", "userspace", "-r", "127.0.0.1", "-p", str(port), "-T", "60"]
            + ["--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            cwd=ROOT,
        )
        # Ctrl-C once two rows are out (a fixed sleep saw one row on a busy machine); rows end in "\r" or "\n"
        chunks: list[str] = []
        assert client.stderr is not None
        stderr = client.stderr
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: stderr.read(1), "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while len(_rows_cpu("".join(chunks) + "\n")) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        client.send_signal(signal.SIGINT)
        client.wait(timeout=60)  # stdout is one JSON line: no pipe fills up meanwhile
        assert client.stdout is not None
        out = client.stdout.read()
        reader.join(30)
        err = "".join(chunks)
    finally:
        server.terminate()
        server.wait(30)
    import json

    summary = json.loads(out.strip().splitlines()[-1])
    rows = _rows_cpu(err)
    assert len(rows) >= 2, err
    mean = sum(rows) / len(rows)
    assert mean > 1, err  # the client does work; a zero summary would be wrong
    assert summary["cpu_pct"] > 0, (summary, rows)
    assert abs(summary["cpu_pct"] - mean) <= max(10.0, 0.5 * mean), (summary, rows)
