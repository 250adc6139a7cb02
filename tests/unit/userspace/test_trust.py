"""Trust between clients and the stack service (docs/userspace.md, "Trust model"), with real processes of a
second unix user (``pyrdstest``, created when missing): SO_PEERCRED checks on both sides, the private per-uid
stack, privilege for stack-wide writes, the non-dumpable service. Root only (skipped otherwise, with the
reason): switching uid needs it."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrds.userspace import control, rpc
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.client.autostart import connect_stack
from pyrds.userspace.config import peer_cred, private_stack_name, stack_address

REPO = Path(__file__).resolve().parents[3]
TEST_USER = "pyrdstest"
NOBODY = 65534


@pytest.fixture(scope="module")
def user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("trust tests switch uid: they need root")
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip(f"no user {TEST_USER!r} and no useradd to create it")
    # two xdist workers may race here: the loser's useradd fails and finds the winner's user
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
        capture_output=True,
        check=False,
    )
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pytest.skip(f"cannot create user {TEST_USER!r}")


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYRDS_STACK_LOG"}  # a log file root may own
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


@functools.cache
def _python_for(uid: int, gid: int) -> str:
    """An interpreter (>= 3.11) that uid can run: tox's may live under root's 0700 home."""
    for cand in (os.path.realpath(sys.executable), "/usr/bin/python3", shutil.which("python3") or ""):
        if not cand:
            continue
        try:
            probe = subprocess.run(
                [cand, "-c", "import sys, pyrds.userspace.client; assert sys.version_info >= (3, 11)"],
                user=uid, group=gid, extra_groups=[], env=_child_env(), cwd="/", capture_output=True,
            )  # fmt: skip
        except OSError:  # not executable for uid
            continue
        if probe.returncode == 0:
            return cand
    pytest.skip(f"no Python >= 3.11 that uid {uid} can run with pyrds importable")


def _popen_as(u: pwd.struct_passwd, args: list[str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [_python_for(u.pw_uid, u.pw_gid), *args],
        user=u.pw_uid, group=u.pw_gid, extra_groups=[], env=kw.pop("env", _child_env()), cwd="/",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def _run_as(u: pwd.struct_passwd, code: str, prefix: list[str] | None = None) -> dict[str, object]:
    """Run ``code`` as u (optionally under ``prefix``, e.g. setpriv) and return the JSON it prints last."""
    py = _python_for(u.pw_uid, u.pw_gid)
    if prefix:
        cmd = [*prefix, py, "-c", code]
        kw: dict[str, object] = {}
    else:
        cmd = [py, "-c", code]
        kw = {"user": u.pw_uid, "group": u.pw_gid, "extra_groups": []}
    res = subprocess.run(cmd, env=_child_env(), cwd="/", capture_output=True, text=True, timeout=90, **kw)  # type: ignore[call-overload]
    assert res.returncode == 0, res.stderr
    out: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _peer_of(name: str) -> tuple[int, int] | None:
    """(pid, uid) of whoever listens on the abstract ``name``, without sending it anything."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(stack_address(name))
        cred = peer_cred(s)
        return cred.pid, cred.uid
    except OSError:
        return None
    finally:
        s.close()


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} still running")


@pytest.fixture
def reap(isolated_stack: str, user: pwd.struct_passwd) -> Iterator[None]:
    """Stop every service left on this test's names (shared, pyrdstest's and nobody's private ones)."""
    yield
    for name in (isolated_stack, private_stack_name(user.pw_uid), private_stack_name(NOBODY)):
        peer = _peer_of(name)
        if peer is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(peer[0], signal.SIGTERM)
            _wait_gone(peer[0])


# a process of the test user holding the shared name: reports connections and bytes it got at stdin EOF
SQUATTER = """
import json, os, socket, sys
lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
lsock.bind(b"\\0" + os.environ["PYRDS_STACK_NAME"].encode())
lsock.listen(16)
print("ready", flush=True)
sys.stdin.read()  # the test is done: take every connection that came and read what it carries
lsock.setblocking(False)
accepted = got = 0
while True:
    try:
        conn = lsock.accept()[0]
    except BlockingIOError:
        break
    accepted += 1
    conn.settimeout(2)
    try:
        while data := conn.recv(1 << 20):
            got += len(data)
    except OSError:
        pass
print(json.dumps({"accepted": accepted, "bytes": got}), flush=True)
"""


def test_root_client_refuses_a_squatter_of_the_shared_name(user: pwd.struct_passwd, reap: None) -> None:
    squatter = _popen_as(user, ["-c", SQUATTER])
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        with pytest.raises(OSError) as ei:
            connect_stack()
        assert ei.value.errno == errno.EACCES
        assert f"uid {user.pw_uid}" in str(ei.value)
        with pytest.raises(OSError) as ei:
            RDSSocket()
        assert ei.value.errno == errno.EACCES
        with pytest.raises(OSError) as ei:
            control.sysctl_set("ping_enable", 0)
        assert ei.value.errno == errno.EACCES
        out, err = squatter.communicate("", timeout=30)
    finally:
        if squatter.poll() is None:
            squatter.kill()
            squatter.wait()
    report = json.loads(out.strip().splitlines()[-1])
    assert report["accepted"] >= 3, (report, err)  # the clients did reach it ...
    assert report["bytes"] == 0, report  # ... and sent it nothing
    assert _peer_of(private_stack_name(0)) is None  # root never goes elsewhere


PRIVATE_CLIENT = """
import json, sys
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.client.autostart import connect_stack
from pyrds.userspace.config import peer_cred
a, b = RDSSocket(), RDSSocket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
b.sendto(b"mine", a.getsockname())
data = a.recv(100)
c = connect_stack()
cred = peer_cred(c)
print(json.dumps({"pid": cred.pid, "uid": cred.uid, "data": data.decode()}), flush=True)
sys.stdin.read()  # keep the sockets (and the service) until the test is done
"""


def test_unprivileged_client_gets_a_private_stack_root_never_uses_it(
    user: pwd.struct_passwd, isolated_stack: str, reap: None
) -> None:
    child = _popen_as(user, ["-c", PRIVATE_CLIENT])
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.communicate(timeout=30)[1]
        mine = json.loads(line)
        assert mine["uid"] == user.pw_uid and mine["data"] == "mine"
        # it serves the private name, the shared one is free
        assert _peer_of(private_stack_name(user.pw_uid)) == (mine["pid"], user.pw_uid)
        assert _peer_of(isolated_stack) is None
        # root's clients start and use their own, root-owned, shared stack
        ctl = connect_stack()
        try:
            cred = peer_cred(ctl)
        finally:
            ctl.close()
        assert cred.uid == 0 and cred.pid != mine["pid"]
        s = RDSSocket()
        s.bind(("127.0.0.1", 0))
        s.sendto(b"root", s.getsockname())
        assert s.recv(10) == b"root"
        s.close()
        assert _peer_of(isolated_stack) == (cred.pid, 0)
    finally:
        child.communicate("", timeout=30)


@pytest.fixture
def private_service(user: pwd.struct_passwd, isolated_stack: str) -> Iterator[int]:
    """pyrdstest's private stack, run directly (``--private``); yields its pid, stops it at the end."""
    svc = _popen_as(
        user, ["-m", "pyrds.userspace.service", "--private"], env=_child_env(PYRDS_IDLE_EXIT="60")
    )
    name = private_stack_name(user.pw_uid)
    try:
        deadline = time.monotonic() + 60
        while (peer := _peer_of(name)) is None:
            assert svc.poll() is None, svc.communicate(timeout=10)[1]
            assert time.monotonic() < deadline, f"nothing listens on {name!r}"
            time.sleep(0.05)
        assert peer == (svc.pid, user.pw_uid)
        yield svc.pid
    finally:
        svc.terminate()
        svc.communicate(timeout=30)


def _refused(sock: socket.socket) -> bool:
    """Whether the service closed this connection instead of serving an OPEN request."""
    sock.settimeout(15)
    try:
        rpc.send_record(sock, rpc.encode((int(rpc.Op.OPEN), ())))
        return sock.recv(1 << 16) == b""
    except (BrokenPipeError, ConnectionResetError):
        return True


REFUSED_AS_OTHER = """
import json, os, socket
from pyrds.userspace import rpc
name = b"\\0" + os.environ["PYRDS_STACK_NAME"].encode() + b"-uid" + os.environ["OWNER"].encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(name)
s.settimeout(15)
try:
    rpc.send_record(s, rpc.encode((int(rpc.Op.OPEN), ())))
    closed = s.recv(1 << 16) == b""
except (BrokenPipeError, ConnectionResetError):
    closed = True
print(json.dumps({"closed": closed}))
"""


def test_private_stack_closes_other_uids(user: pwd.struct_passwd, private_service: int) -> None:
    name = private_stack_name(user.pw_uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(stack_address(name))
    try:
        assert _refused(s), "the private stack served root"
    finally:
        s.close()
    nobody = pwd.getpwuid(NOBODY)
    code = REFUSED_AS_OTHER.replace('os.environ["OWNER"]', repr(str(user.pw_uid)))
    assert _run_as(nobody, code) == {"closed": True}
    # ... while it serves its owner, who may also write its settings
    own = _run_as(
        user,
        "import json\nfrom pyrds.userspace import control\nfrom pyrds.userspace.client.autostart import "
        "connect_stack\nfrom pyrds.userspace.config import peer_cred\n"
        "pid = peer_cred(connect_stack()).pid\ncontrol.sysctl_set('ping_enable', 0)\n"
        "print(json.dumps({'pid': pid, 'ping': control.sysctl_get()['ping_enable']}))",
    )
    assert own == {"pid": private_service, "ping": 0}
    os.kill(private_service, 0)  # still serving after the refusals


def test_service_is_not_dumpable(user: pwd.struct_passwd, private_service: int) -> None:
    # the files of a non-dumpable process's /proc/PID belong to root (proc(5)), and its uid's other processes
    # cannot read its memory
    assert os.stat(f"/proc/{private_service}/mem").st_uid == 0
    assert os.stat(f"/proc/{private_service}/status").st_uid == 0
    code = (
        f"import json\ntry:\n    open('/proc/{private_service}/mem', 'rb').close(); e = 0\n"
        "except OSError as exc:\n    e = exc.errno\nprint(json.dumps({'errno': e}))"
    )
    assert _run_as(user, code)["errno"] in (errno.EACCES, errno.EPERM)


UNPRIVILEGED_WRITES = """
import errno, json, os
from pyrds.userspace import control
from pyrds.userspace.client.autostart import connect_stack
from pyrds.userspace.config import peer_cred
def code(fn, *args):
    try:
        fn(*args)
    except OSError as exc:
        return exc.errno
    return 0
out = {
    "server_uid": peer_cred(connect_stack()).uid,
    "read": control.sysctl_get()["ping_enable"],
    "set": code(control.sysctl_set, "ping_enable", 0),
    "rcvbuf": code(control.sysctl_set, "rds_tcp_rcvbuf", 65536),
    "force": code(control.force_reconnect),
    "unknown": code(control.sysctl_set, "no_such_knob", 1),
    "proc_sys": code(os.open, "/proc/sys/net/ipv4/ip_forward", os.O_WRONLY),
}
print(json.dumps(out))
"""


def test_unprivileged_writes_on_roots_stack_are_refused(user: pwd.struct_passwd, reap: None) -> None:
    before = control.sysctl_get()  # starts root's shared stack
    out = _run_as(user, UNPRIVILEGED_WRITES)
    assert out["server_uid"] == 0 and out["read"] == before["ping_enable"] == 1  # reads stay open
    assert out["proc_sys"] == errno.EACCES  # what the kernel says to this user ...
    assert out["set"] == out["rcvbuf"] == out["force"] == out["proc_sys"]  # ... the stack says too
    assert out["unknown"] == errno.ENOENT
    assert control.sysctl_get() == before
    control.sysctl_set("ping_enable", 0)  # root's write works
    assert control.sysctl_get()["ping_enable"] == 0


CAP_WRITE = """
import json
from pyrds.userspace import control
from pyrds.userspace.client.autostart import connect_stack
from pyrds.userspace.config import peer_cred
uid = peer_cred(connect_stack()).uid
try:
    control.sysctl_set("reconnect_max_delay_ms", 777); e = 0
except OSError as exc:
    e = exc.errno
print(json.dumps({"server_uid": uid, "errno": e}))
"""


# inside a user namespace the client cannot recognise the host's root (SO_PEERCRED shows the overflow uid),
# so this one speaks the wire itself to ask root's stack anyway
RAW_WRITE = """
import json, os, socket
from pyrds.userspace import rpc
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(b"\\0" + os.environ["PYRDS_STACK_NAME"].encode())
rpc.send_record(s, rpc.encode((int(rpc.Op.SYSCTL_SET), ("reconnect_max_delay_ms", 777))))
code, _ = rpc.decode(rpc.recv_record(s)[0])
print(json.dumps({"euid": os.geteuid(), "errno": code}))
"""


def test_cap_net_admin_may_write_a_user_namespace_root_may_not(user: pwd.struct_passwd, reap: None) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to give a non-root process CAP_NET_ADMIN")
    assert control.sysctl_get()["reconnect_max_delay_ms"] == 1000  # root's shared stack
    ids = ["--reuid", str(user.pw_uid), "--regid", str(user.pw_gid), "--clear-groups"]
    # root of a user namespace of its own has every capability there, but not over this stack
    if shutil.which("unshare") is not None:
        userns = ["setpriv", *ids, "unshare", "--user", "--map-root-user"]
        probe = subprocess.run([*userns, "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            assert _run_as(user, RAW_WRITE, prefix=userns) == {"euid": 0, "errno": errno.EACCES}
            assert control.sysctl_get()["reconnect_max_delay_ms"] == 1000
    caps = ["setpriv", *ids, "--inh-caps", "+net_admin", "--ambient-caps", "+net_admin"]
    assert _run_as(user, CAP_WRITE, prefix=caps) == {"server_uid": 0, "errno": 0}
    assert control.sysctl_get()["reconnect_max_delay_ms"] == 777


# SO_SNDBUFFORCE / SO_RCVBUFFORCE on a userspace RDS socket and on a kernel TCP socket, as the same process
FORCE_BUF = """
import json, socket
import pyrds
from pyrds.constants import SO_RCVBUFFORCE, SO_SNDBUFFORCE
from pyrds.userspace.client.autostart import connect_stack
from pyrds.userspace.config import peer_cred
def code(s, name, value):
    try:
        s.setsockopt(socket.SOL_SOCKET, name, value); return 0
    except OSError as exc:
        return exc.errno
rds = pyrds.socket("userspace")
tcp = socket.socket()
out = {"server_uid": peer_cred(connect_stack()).uid}
for key, name in (("snd", SO_SNDBUFFORCE), ("rcv", SO_RCVBUFFORCE)):
    out[key] = code(rds, name, 1 << 22)
    out[key + "_kernel"] = code(tcp, name, 1 << 22)
    out[key + "_short"] = code(rds, name, b"\\0")  # the value is read first: EINVAL before EPERM
out["plain"] = code(rds, socket.SO_SNDBUF, 1 << 16)
out["sndbuf"] = rds.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
print(json.dumps(out))
"""


def test_buffer_force_options_need_cap_net_admin(user: pwd.struct_passwd, reap: None) -> None:
    """sock_setsockopt: SO_SNDBUFFORCE/SO_RCVBUFFORCE are EPERM without CAP_NET_ADMIN (checked after the
    int is read); the stack asks the same of its client, whatever its uid, and lets it through with it."""
    control.sysctl_get()  # starts root's shared stack
    out = _run_as(user, FORCE_BUF)
    assert out["server_uid"] == 0
    assert out["snd_kernel"] == out["rcv_kernel"] == errno.EPERM  # what the kernel says to this user ...
    assert out["snd"] == out["rcv"] == errno.EPERM  # ... the stack says too
    assert out["snd_short"] == out["rcv_short"] == errno.EINVAL
    assert out["plain"] == 0 and out["sndbuf"] == 2 * (1 << 16)
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to give a non-root process CAP_NET_ADMIN")
    ids = ["--reuid", str(user.pw_uid), "--regid", str(user.pw_gid), "--clear-groups"]
    caps = ["setpriv", *ids, "--inh-caps", "+net_admin", "--ambient-caps", "+net_admin"]
    out = _run_as(user, FORCE_BUF, prefix=caps)
    assert out["snd_kernel"] == out["rcv_kernel"] == out["snd"] == out["rcv"] == 0
