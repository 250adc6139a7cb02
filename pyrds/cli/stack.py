"""``pyrds stack start|stop|status``: the userspace stack service of this network namespace, run on purpose.

``start`` runs the shared stack (root) or this uid's private one (others, or ``--private``) with idle exit
off (``--no-idle-exit``), detached, and waits until it serves; ``--foreground`` runs it in this process
instead (systemd). A stack already serving is kept (NO_IDLE_EXIT turns off the idle exit of one a client
started). ``status`` asks the running service(s) with the STATUS control operation and exits 3 when
none serves, like ``systemctl status``. ``stop`` sends STOP (root, CAP_NET_ADMIN, or a private stack's owner;
EACCES otherwise) and waits until the service is gone (3: none ran). Nothing here ever autostarts a stack.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
from typing import Any

from pyrds.api import os_error
from pyrds.cli.common import UserError, describe_oserror
from pyrds.userspace import rpc
from pyrds.userspace.client.autostart import spawn_service, start_timeout
from pyrds.userspace.client.stackctl import WrongServer, stack_request
from pyrds.userspace.config import private_stack_name, stack_name

NOT_RUNNING = 3  # systemctl status: "program is not running"
STOP_TIMEOUT = 10.0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stack", help="start, stop or show this namespace's userspace stack service")
    actions = p.add_subparsers(dest="action", metavar="{start,stop,status}")
    actions.required = True
    start = actions.add_parser("start", help="start the stack service (no idle exit)")
    start.add_argument("--private", action="store_true", help="this uid's private stack, even as root")
    start.add_argument("--foreground", action="store_true", help="run the service in this process (systemd)")
    start.set_defaults(func=run_start)
    status = actions.add_parser("status", help="show the stack(s) serving this namespace (exit 3: none)")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(func=run_status)
    stop = actions.add_parser("stop", help="stop the stack service (exit 3: none ran)")
    stop.add_argument("--private", action="store_true", help="this uid's private stack, even as root")
    stop.set_defaults(func=run_stop)


def _candidates() -> list[tuple[str, int]]:
    """(abstract name, the uid that must serve it) of the stacks this uid may use: the shared one (root's)
    and, for a non-root uid, its private one."""
    euid = os.geteuid()
    names = [(stack_name(), 0)]
    if euid != 0:
        names.append((private_stack_name(euid), euid))
    return names


def _call(name: str, server_uid: int, op: rpc.Op) -> Any:
    """One control operation on the service listening on ``name``; None when none listens there or it is
    not served by ``server_uid`` (never talk to a squatter); OSError with the service's errno."""
    try:
        return stack_request(name, server_uid, op)
    except WrongServer:
        return None


def _status(name: str, server_uid: int) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] | None = _call(name, server_uid, rpc.Op.STATUS)
    except (rpc.ConnectionClosed, EOFError, ConnectionResetError):  # it exited while we asked
        return None
    if found is not None:
        found["uptime"] = round(max(0.0, found["now"] - found.get("started", found["now"])), 1)
    return found


def _describe(st: dict[str, Any]) -> str:
    served = "every uid (shared)" if st["owner"] is None else f"uid {st['owner']} only (private)"
    idle = "never" if st["idle_exit"] < 0 else f"after {st['idle_exit']:g} s idle"
    return (
        f"pyrds stack {st['name']!r}: running, pid {st['pid']}, uid {st['uid']}, serves {served}, "
        f"up {st['uptime']:.1f} s, idle exit {idle}, {st.get('clients', 0)} client connection(s), "
        f"{st['rds_sockets']} RDS socket(s), {st['tcp_connections']} RDS/TCP connection(s), "
        f"TCP port {st['tcp_port']}"
    )


def _target(private: bool) -> tuple[str, int, str]:
    """The stack ``start``/``stop`` act on: (name, serving uid, service mode option)."""
    euid = os.geteuid()
    if euid == 0 and not private:
        return stack_name(), 0, "--shared"
    return private_stack_name(euid), euid, "--private"


def run_status(args: argparse.Namespace) -> int:
    stacks = [st for name, uid in _candidates() if (st := _status(name, uid)) is not None]
    if args.json:
        print(json.dumps({"running": bool(stacks), "stacks": stacks}))
    elif stacks:
        for st in stacks:
            print(_describe(st))
    else:
        print(f"pyrds stack {stack_name()!r}: not running")
    return 0 if stacks else NOT_RUNNING


def run_start(args: argparse.Namespace) -> int:
    name, uid, mode = _target(args.private)
    st = _status(name, uid)
    if st is not None:
        if st["idle_exit"] >= 0:  # started on demand by a client: keep it (privileged, as stop is)
            _call(name, uid, rpc.Op.NO_IDLE_EXIT)
            st = _status(name, uid) or st
        print(f"already running: {_describe(st)}")
        return 0
    argv = [sys.executable, "-m", "pyrds.userspace.service", mode, "--no-idle-exit"]
    if args.foreground:
        sys.stdout.flush()
        os.execv(sys.executable, argv)  # systemd supervises the service itself
    deadline = time.monotonic() + start_timeout()
    spawn_service(mode, "--no-idle-exit")
    while (st := _status(name, uid)) is None:
        if time.monotonic() > deadline:
            raise os_error(errno.ECONNREFUSED, f"pyrds stack {name!r} did not start")
        time.sleep(0.05)
    print(f"started: {_describe(st)}")
    return 0


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def run_stop(args: argparse.Namespace) -> int:
    name, uid, _mode = _target(args.private)
    st = _status(name, uid)
    if st is None and os.geteuid() != 0 and not args.private:
        name, uid = stack_name(), 0  # no private stack: root's shared one (refused unless privileged)
        st = _status(name, uid)
    if st is None:
        print(f"pyrds stack {name!r}: not running")
        return NOT_RUNNING
    try:
        _call(name, uid, rpc.Op.STOP)
    except PermissionError as exc:
        who = "root or CAP_NET_ADMIN" if uid == 0 else f"uid {uid}, root or CAP_NET_ADMIN"
        what = f"pyrds stack {name!r} (pid {st['pid']})"
        raise UserError(f"not allowed to stop {what}: {describe_oserror(exc)}; only {who}", 1) from None
    deadline = time.monotonic() + STOP_TIMEOUT
    while not _gone(st["pid"]) or _status(name, uid) is not None:
        if time.monotonic() > deadline:
            raise os_error(errno.ETIMEDOUT, f"pyrds stack {name!r} (pid {st['pid']}) did not exit")
        time.sleep(0.05)
    print(f"stopped pyrds stack {name!r} (pid {st['pid']})")
    return 0
