"""``pyrds stack start|stop|status`` and the systemd units (issue 8 item 1).

The lifecycle tests run in a fresh network namespace each, with the default stack name, so that they meet
no other test's stack (and none meets theirs); PYRDS_IDLE_EXIT is 1 s there, so a stack that would idle-exit
is seen doing it. The unit files are checked with ``systemd-analyze verify`` when it exists, and parsed here
in any case.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrds.userspace.config import DEFAULT_STACK_NAME
from tests.unit.test_cli import _can_netns, run_captured
from tests.unit.userspace.test_trust import _python_for, _wait_gone
from tests.unit.userspace.test_trust import user as user  # the fixture (pyrdstest, created when missing)

REPO = Path(__file__).resolve().parents[3]
UNITS = REPO / "contrib" / "systemd"
CLI = ["-m", "pyrds.cli.main", "stack"]
IDLE_EXIT = 1.0


def _env(idle_exit: float = IDLE_EXIT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRDS_")}
    env.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", PYRDS_IDLE_EXIT=str(idle_exit))
    return env


def _run(
    ns: str, args: list[str], as_user: pwd.struct_passwd | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python args`` in ``ns`` (as ``as_user`` when given), output in files: a service it starts
    inherits none of them, but files are never waited on anyway."""
    kw: dict[str, Any] = {"env": env or _env(), "cwd": "/"}
    python = sys.executable
    if as_user is not None:
        python = _python_for(as_user.pw_uid, as_user.pw_gid)
        kw.update(user=as_user.pw_uid, group=as_user.pw_gid, extra_groups=[])
    return run_captured([python, *args], 90, ns, **kw)


def _status(ns: str) -> tuple[int, dict[str, Any]]:
    res = _run(ns, [*CLI, "status", "--json"])
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


@pytest.fixture
def ns() -> Iterator[str]:
    why = _can_netns()
    if why is not None:
        pytest.skip(why)
    from pyrds.netns import create_netns, delete_netns, netns_pids, unique_name

    name = create_netns(unique_name("pyrds-stackcmd"))
    try:
        yield name
    finally:
        for pid in netns_pids(name):  # a stack a failed test left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _wait_gone(pid)
        delete_netns(name)


# a userspace socket in the namespace: which service serves it (SO_PEERCRED of its control connection)
SOCKET_USER = """
import json
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.config import peer_cred
s = RDSSocket()
s.bind(("127.0.0.1", 0))
print(json.dumps({"pid": peer_cred(s._ctl).pid}))
s.close()
"""


@pytest.mark.netns
def test_start_status_stop(ns: str) -> None:
    code, st = _status(ns)
    assert code == 3 and st == {"running": False, "stacks": []}

    started = _run(ns, [*CLI, "start"])
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("started: ") and "idle exit never" in started.stdout
    code, st = _status(ns)
    assert code == 0 and st["running"], st
    (stack,) = st["stacks"]
    pid = stack["pid"]
    assert f"pid {pid}," in started.stdout
    assert stack["uid"] == 0 and stack["owner"] is None and stack["idle_exit"] < 0

    again = _run(ns, [*CLI, "start"])  # idempotent: says so, same service
    assert again.returncode == 0 and again.stdout.startswith("already running: "), again
    assert f"pid {pid}," in again.stdout

    used = _run(ns, ["-c", SOCKET_USER])  # a socket of this namespace uses that very service
    assert used.returncode == 0, used.stderr
    assert json.loads(used.stdout)["pid"] == pid

    time.sleep(IDLE_EXIT * 3)  # its last client is gone: an autostarted stack would have exited by now
    code, st = _status(ns)
    assert code == 0 and st["stacks"][0]["pid"] == pid and st["stacks"][0]["uptime"] >= IDLE_EXIT * 3

    stopped = _run(ns, [*CLI, "stop"])
    assert stopped.returncode == 0
    assert f"stopped pyrds stack '{DEFAULT_STACK_NAME}' (pid {pid})" in stopped.stdout
    _wait_gone(pid, 1.0)  # stop returned once it was gone
    code, st = _status(ns)
    assert code == 3 and not st["running"]
    again = _run(ns, [*CLI, "stop"])
    assert again.returncode == 3 and "not running" in again.stdout


@pytest.mark.netns
def test_start_keeps_a_stack_a_client_started(ns: str) -> None:
    """``start`` finding an autostarted stack (idle exit on) turns its idle exit off instead of reporting a
    stack that is about to go away. The autostarted stack lingers 60 s after its last socket, so a loaded
    machine cannot make it exit before ``start`` asks (with 4 s it once did); the status then says never."""
    linger = 60.0
    used = _run(ns, ["-c", SOCKET_USER], env=_env(idle_exit=linger))
    assert used.returncode == 0, used.stderr
    pid = json.loads(used.stdout)["pid"]
    code, st = _status(ns)
    assert code == 0 and st["stacks"][0]["pid"] == pid and st["stacks"][0]["idle_exit"] == linger

    kept = _run(ns, [*CLI, "start"])
    assert kept.returncode == 0 and kept.stdout.startswith("already running: "), kept
    assert f"pid {pid}," in kept.stdout and "idle exit never" in kept.stdout
    code, st = _status(ns)
    assert code == 0 and st["stacks"][0]["pid"] == pid and st["stacks"][0]["idle_exit"] < 0
    assert _run(ns, [*CLI, "stop"]).returncode == 0


@pytest.mark.netns
def test_unprivileged_stop_of_the_shared_stack_is_refused(ns: str, user: pwd.struct_passwd) -> None:
    started = _run(ns, [*CLI, "start"])
    assert started.returncode == 0, started.stderr
    pid = _status(ns)[1]["stacks"][0]["pid"]

    refused = _run(ns, [*CLI, "stop"], as_user=user)
    assert refused.returncode == 1, refused
    want = f"pyrds stack: not allowed to stop pyrds stack '{DEFAULT_STACK_NAME}' (pid "
    assert refused.stderr.startswith(want)
    assert "[EACCES]" in refused.stderr and "Traceback" not in refused.stderr
    seen = _run(ns, [*CLI, "status", "--json"], as_user=user)  # a read: open to every uid
    assert seen.returncode == 0 and json.loads(seen.stdout)["stacks"][0]["pid"] == pid

    code, st = _status(ns)
    assert code == 0 and st["stacks"][0]["pid"] == pid  # still serving
    assert _run(ns, [*CLI, "stop"]).returncode == 0


@pytest.mark.netns
def test_a_user_starts_and_stops_a_private_stack(ns: str, user: pwd.struct_passwd) -> None:
    """No root stack: a non-root uid's start/status/stop act on its private stack, served by itself."""
    uid = user.pw_uid
    started = _run(ns, [*CLI, "start"], as_user=user)
    assert started.returncode == 0, started.stderr
    assert f"pyrds stack '{DEFAULT_STACK_NAME}-uid{uid}': running" in started.stdout
    seen = _run(ns, [*CLI, "status", "--json"], as_user=user)
    assert seen.returncode == 0, seen.stderr
    (stack,) = json.loads(seen.stdout)["stacks"]
    assert stack["uid"] == uid and stack["owner"] == uid and stack["idle_exit"] < 0
    assert _status(ns)[0] == 3  # root's view: no shared stack (root never uses a private one)

    stopped = _run(ns, [*CLI, "stop"], as_user=user)
    assert stopped.returncode == 0, stopped.stderr
    _wait_gone(stack["pid"], 1.0)
    assert _run(ns, [*CLI, "status"], as_user=user).returncode == 3


@pytest.mark.netns
def test_foreground_service_notifies_systemd_and_stops_on_sigterm(ns: str) -> None:
    """What the units run: the service in the foreground, READY=1 on $NOTIFY_SOCKET once it serves, a clean
    exit 0 on SIGTERM (systemctl stop)."""
    from pyrds.netns import popen_in_netns

    with tempfile.TemporaryDirectory() as tmp, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(f"{tmp}/notify")
        notify.settimeout(60)
        env = {**_env(), "NOTIFY_SOCKET": f"{tmp}/notify"}
        argv = [sys.executable, *_unit_argv("pyrds-stack.service")[1:]]
        proc = popen_in_netns(ns, argv, env=env, cwd="/", stderr=subprocess.PIPE, text=True)
        try:
            assert notify.recv(64) == b"READY=1"
            code, st = _status(ns)
            assert code == 0 and st["stacks"][0]["pid"] == proc.pid and st["stacks"][0]["idle_exit"] < 0
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
            assert notify.recv(64) == b"STOPPING=1"
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
        assert err == "", err
    assert _status(ns)[0] == 3


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=True, empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


def _unit_argv(name: str) -> list[str]:
    return _unit(name)["Service"]["ExecStart"].split()


@pytest.mark.parametrize("name", ["pyrds-stack.service", "pyrds-stack@.service"])
def test_unit_files(name: str, tmp_path: Path) -> None:
    unit = _unit(name)
    service = unit["Service"]
    argv = service["ExecStart"].split()
    assert argv[1:] == ["-m", "pyrds.userspace.service", "--shared", "--no-idle-exit"]
    assert importlib.util.find_spec(argv[2]) is not None
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert "PrivateNetwork" not in service  # it serves the namespace it runs in
    if name.startswith("pyrds-stack@"):
        assert service["NetworkNamespacePath"] == "/run/netns/%i"
    assert unit["Install"]["WantedBy"] == "multi-user.target"

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return
    copy = tmp_path / name.replace("@.", "@test.")  # a template is verified as one of its instances
    copy.write_text((UNITS / name).read_text().replace("/usr/bin/python3", sys.executable))
    res = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values, only warning: every line about our file is a failure
    assert res.returncode == 0 and copy.name not in res.stderr + res.stdout, res.stderr + res.stdout
