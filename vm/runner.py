"""Host side: boot guests with virtme-ng, relay their output, enforce the timeout, collect results."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from vm import virtiofs
from vm.accel import Accel
from vm.kernel import GuestKernel
from vm.paths import REPO_ROOT, cache_dir

GUEST_SCRIPT = os.path.join(REPO_ROOT, "vm", "guest.py")
GUEST_SYSTEM_PYTHON = "/usr/bin/python3"
LINK_NET = "10.99.0"
MACS = {"a": "52:54:00:99:00:01", "b": "52:54:00:99:00:02"}
ADDRS = {"a": f"{LINK_NET}.1", "b": f"{LINK_NET}.2"}
PEER_GRACE_S = 30.0


class HarnessError(RuntimeError):
    """The harness itself cannot run (missing tool, bad arguments)."""


@dataclass
class RunConfig:
    kernel: GuestKernel
    accel: Accel
    cmd: list[str]
    topology: str = "netns"
    cpus: int = 2
    memory: str = "2G"
    timeout: float = 1200.0
    junit: str | None = None
    peer_cmd: list[str] = field(default_factory=lambda: ["sleep", "infinity"])
    venv_bin: str | None = None
    pythonpath: str | None = None
    modules: str | None = None
    keep_results: bool = False
    copy_out: str | None = None  # copy guest A's results directory (``{results}``) here afterwards
    verbose: bool = False
    code_cache: bool = True  # see cached_trees()
    #: the guest's root filesystem: a virtiofsd path (vng exports the root over virtiofs with it), or None
    #: for 9p (``--force-9p``); :func:`resolve_rootfs` picks it
    virtiofsd: str | None = None
    #: two-guests only: guest B's vCPUs and memory (None: ``cpus`` / ``memory``), and whether guest A gets an
    #: rxe device on the link at boot (``--peer-ib`` leaves it to the suite: a userspace stack started while
    #: an rxe device exists attaches RDS/IB, which the main suite must not see)
    peer_cpus: int | None = None
    peer_memory: str | None = None
    link_rxe_a: bool = True


@dataclass
class RunResult:
    rc: int
    boot_s: float | None  # host wall time from launch until CMD started in guest A
    guest_uptime_s: float | None  # guest A's uptime when CMD started
    wall_s: float
    results_dir: str
    timed_out: bool = False
    messages: list[str] = field(default_factory=list)


def _vng() -> str:
    vng = shutil.which("vng")
    if vng is None:
        raise HarnessError("virtme-ng not found: pip install virtme-ng (1.42 is known to work)")
    return vng


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (read from /proc/net/tcp: connecting to test it would
    consume QEMU's one-shot ``-netdev socket,listen=`` accept)."""
    want = f"0100007F:{port:04X}"
    try:
        with open("/proc/net/tcp") as fh:
            return any(ln.split()[1] == want and ln.split()[3] == "0A" for ln in fh.readlines()[1:])
    except OSError:
        return False


def _wait_listening(port: int, guest: _Guest, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and guest.proc.poll() is None:
        if _listening(port):
            return True
        time.sleep(0.2)
    return False


#: ``--rootfs`` / ``$PYRDS_VM_ROOTFS`` values
ROOTFS_MODES = ("auto", "virtiofs", "9p")


def resolve_rootfs(mode: str | None = None) -> tuple[str | None, str]:
    """(virtiofsd path or None for 9p, why) for ``mode`` (default ``$PYRDS_VM_ROOTFS`` or auto).

    auto: virtiofs when a usable virtiofsd exists (vm/virtiofs.py; ``python -m vm fetch-virtiofsd`` gets one
    on bookworm), else 9p. virtiofs: a usable virtiofsd or a HarnessError. 9p: always 9p."""
    mode = mode or os.environ.get("PYRDS_VM_ROOTFS") or "auto"
    if mode not in ROOTFS_MODES:
        raise HarnessError(f"unknown root filesystem mode {mode!r} ({', '.join(ROOTFS_MODES)})")
    if mode == "9p":
        return None, "9p requested"
    daemon = virtiofs.find_virtiofsd()
    if daemon:
        return daemon, f"virtiofsd {daemon}"
    if mode == "virtiofs":
        raise HarnessError("no usable virtiofsd (Rust daemon): python -m vm fetch-virtiofsd")
    return None, "no usable virtiofsd (python -m vm fetch-virtiofsd)"


def vng_env(cfg: RunConfig) -> dict[str, str]:
    """vng's environment: with virtiofs, PATH starts with a directory whose ``virtiofsd`` is the chosen one
    (vng takes ``virtiofsd`` on PATH before its fixed places, see vm/virtiofs.py)."""
    env = dict(os.environ)
    if cfg.virtiofsd:
        env["PATH"] = os.pathsep.join(p for p in (virtiofs.vng_path_dir(cfg.virtiofsd), env.get("PATH")) if p)
    return env


#: 9p mount tags of the cached code trees (guest.py mounts ``pyrdsro<N>`` with cache=loose)
CACHE_TAG = "pyrdsro"


def cached_trees(cfg: RunConfig) -> list[str]:
    """Host directories the guest only reads code from and nothing writes during a run: the repository (the
    guest still writes through an overlay), the Python installation running this harness and its venv (a tox
    env's ``{envpython}`` runs the suite), its standard library (also when it is Debian's, under /usr), and
    the guest venv.

    Why: vng shares the host's root over 9p without a cache, so every ``stat``/``open`` of an import is a
    round trip through the emulated virtio device. Measured in a 7.3 TCG guest: ``python -c pass`` 3.1 s
    and ``import pyrds.cli.main, pytest, pyroute2`` 26-33 s over the root; with the Python installation on a
    second 9p export mounted ``cache=loose``, 1.0 s and 17-20 s. The suite starts hundreds of Python
    processes (CLI calls, stack services, node agents).

    None with a virtiofs root: vng exports it with ``--cache always``, which caches these trees too
    (measured the same with and without the extra 9p devices, vm/README.md)."""
    if not cfg.code_cache or cfg.virtiofsd:
        return []
    stdlib = sysconfig.get_paths()["stdlib"]  # /usr/lib/python3.11 for Debian's python (the conformance env)
    candidates = [REPO_ROOT, sys.base_prefix, sys.prefix, stdlib]
    if cfg.venv_bin:
        candidates.append(os.path.dirname(cfg.venv_bin))
    trees: list[str] = []
    # parents before their subtrees (shorter first); equal lengths by name, so the tags do not follow the
    # process's string hash seed (a set's order)
    real = {os.path.realpath(c) for c in candidates if c and os.path.isdir(c)}
    for path in sorted(real, key=lambda p: (len(p), p)):
        if path == "/" or (path.startswith("/usr/") or path == "/usr") and path != os.path.realpath(stdlib):
            continue  # vng's own overlay; too large (the interpreter's stdlib alone is fine)
        if any(path == t or path.startswith(t + os.sep) for t in trees):
            continue
        trees.append(path)
    return trees


def _substitute(cmd: Sequence[str], results_a: str, junit_guest: str) -> list[str]:
    return [a.replace("{junit}", junit_guest).replace("{results}", results_a) for a in cmd]


def _looks_like_pytest(cmd: Sequence[str]) -> bool:
    names = [os.path.basename(a) for a in cmd[:3]]
    return "pytest" in names or any(a == "pytest" for a in cmd[1:3])


def guest_command(cfg: RunConfig, role: str, results: str, port: int | None) -> list[str]:
    """The vng argv for guest ``role`` ('a' runs CMD, 'b' runs the peer agent)."""
    cpus, memory = cfg.cpus, cfg.memory
    if role == "b":
        cpus, memory = cfg.peer_cpus or cpus, cfg.peer_memory or memory
    argv = [_vng(), "--run", cfg.kernel.vmlinuz, "-p", str(cpus), "-m", memory]
    if cfg.accel == "tcg":
        argv.append("--disable-kvm")
    if cfg.virtiofsd:
        # vng switches to QEMU's "microvm" machine (no PCI) when virtiofs works under KVM; the harness's
        # virtconsole, virtio-net-pci and 9p devices need a PCI machine
        argv.append("--disable-microvm")
    else:
        # no usable daemon: say so, or vng tries QEMU's C virtiofsd and waits 3.1 s before using 9p
        argv.append("--force-9p")
    argv += ["--name", f"pyrds-{role}", "--cwd", REPO_ROOT, "--rwdir", results, "--overlay-rwdir", REPO_ROOT]
    if cfg.verbose:
        argv.append("--verbose")
    else:
        # the guest kernel's console, always kept: a second UART whose output is a file in the results
        # directory (vng sends its own console, ttyS0, to /dev/null unless --verbose). Warnings and worse
        # only (loglevel 5: oopses, WARNs, panics, the OOM killer), so a quiet kernel costs nothing.
        argv += ["--append", f"console={CONSOLE_TTY}", "--append", f"loglevel={CONSOLE_LOGLEVEL}"]
    inner = [GUEST_SYSTEM_PYTHON, GUEST_SCRIPT, "--results", results, "--role", role, "--repo", REPO_ROOT]
    if cfg.venv_bin:
        inner += ["--venv-bin", cfg.venv_bin]
    if cfg.pythonpath:
        inner += ["--pythonpath", cfg.pythonpath]
    if cfg.modules is not None:
        inner += ["--modules", cfg.modules]
    qemu_opts: list[str] = []
    if not cfg.verbose:
        log = os.path.join(results, role, CONSOLE_LOG)
        qemu_opts.append(f"-chardev file,id=pyrdsconsole,path={log} -device virtconsole,chardev=pyrdsconsole")
    for n, tree in enumerate(cached_trees(cfg)):
        export = f"local,path={tree},mount_tag={CACHE_TAG}{n},security_model=none,readonly=on"
        qemu_opts.append(f"-virtfs {export}")
        inner += ["--cached-tree", f"{CACHE_TAG}{n}={tree}"]
    if cfg.topology == "two-guests":
        assert port is not None
        mode = "listen" if role == "a" else "connect"
        qemu_opts.append(
            f"-netdev socket,id=pyrdsnet,{mode}=127.0.0.1:{port} "
            f"-device virtio-net-pci,netdev=pyrdsnet,mac={MACS[role]}"
        )
        other = "b" if role == "a" else "a"
        inner += ["--mac", MACS[role], "--addr", f"{ADDRS[role]}/24", "--peer-addr", ADDRS[other]]
        if role == "a" and not cfg.link_rxe_a:
            inner += ["--rxe", ""]
        if role == "a":
            inner.append("--wait-peer")
    if qemu_opts:
        argv.append(f"--qemu-opts={' '.join(qemu_opts)}")  # vng quirk: the '=' form, else taken as a flag
    if role == "a":
        junit_guest = os.path.join(results, "a", "junit.xml")
        cmd = _substitute(cfg.cmd, os.path.join(results, "a"), junit_guest)
        if cfg.junit and not any("{junit}" in a for a in cfg.cmd) and _looks_like_pytest(cmd):
            if not any(a.startswith("--junitxml") or a.startswith("--junit-xml") for a in cmd):
                cmd.append(f"--junitxml={junit_guest}")
    else:
        cmd = list(cfg.peer_cmd)
    inner += ["--", *cmd]
    argv += ["--exec", shlex.join(inner)]
    return argv


def _relay(stream: IO[bytes], out: IO[str], prefix: str) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        out.write(prefix + line if prefix else line)
        out.flush()


class _Guest:
    def __init__(self, role: str, argv: list[str], prefix: str, env: dict[str, str] | None = None) -> None:
        self.role = role
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        # vng's QEMU writes guest stdout/stderr to /proc/self/fd/1 and 2 separately: pipes, never one file
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.threads = [
            threading.Thread(target=_relay, args=(self.proc.stdout, sys.stdout, prefix), daemon=True),
            threading.Thread(target=_relay, args=(self.proc.stderr, sys.stderr, prefix), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def kill(self) -> None:
        if self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)  # our own child's session: vng and its QEMU
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def finish(self) -> None:
        for t in self.threads:
            t.join(5.0)


def _read_rc(path: str) -> int | None:
    try:
        with open(path) as fh:
            rc = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return 128 - rc if rc < 0 else rc  # killed by signal N -> 128+N, like a shell


#: the guest kernel console (see :func:`guest_command`): its file in each guest's results directory, the
#: UART it is written to, and the console loglevel (messages below it are printed)
CONSOLE_LOG = "console.log"
CONSOLE_TTY = "hvc0"
CONSOLE_LOGLEVEL = 5
#: lines of the guest console printed when a guest ends without an exit status
CONSOLE_TAIL_LINES = 60


def console_tail(path: str, lines: int = CONSOLE_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a guest console log, decoded leniently; [] when there is none."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read()
    except OSError:
        return []
    text = data.decode(errors="replace").replace("\r", "")
    return [line for line in text.split("\n") if line.strip()][-lines:]


#: a kernel console line that says the guest kernel itself failed (not CMD, not QEMU)
KERNEL_CRASH_MARKERS = ("Kernel panic", "Oops:", "BUG:", "general protection fault", "Call Trace:")
#: the record of guests that died mid-command, per kernel in ``matrix --out`` (see :func:`guest_death`)
GUEST_DEATHS = "guest-deaths.json"


def died_mid_command(res: RunResult) -> bool:
    """CMD started in guest A, then the guest ended with no exit status and no timeout (panic, QEMU death)."""
    return res.rc == 125 and res.boot_s is not None and not res.timed_out


def guest_death(res: RunResult, console: str, attempt: int) -> dict[str, object]:
    """What one death looked like: when, the harness's messages, the console's tail, and whether the console
    shows a kernel crash (:data:`KERNEL_CRASH_MARKERS`)."""
    tail = console_tail(console)
    return {
        "attempt": attempt,
        "wall_s": round(res.wall_s, 1),
        "kernel_crash": any(m in line for line in tail for m in KERNEL_CRASH_MARKERS),
        "console_tail": tail,
        "messages": [m for m in res.messages if not m.startswith("guest A's kernel console")],
    }


#: boots that die before CMD starts (nothing ran in the guest) are tried again this many times
BOOT_RETRIES = 2


def run(cfg: RunConfig) -> RunResult:
    """Boot the topology once, run CMD in guest A, return its status and timings.

    A boot that ends before CMD started in guest A (no ``started`` file: vng or QEMU failed, or the kernel
    died while booting) is tried again, up to :data:`BOOT_RETRIES` times, and the result says so: nothing ran
    in the guest, so a retry cannot hide a test's outcome. Seen once on 2026-11-23: a 7.3 boot ended after
    10.7 s with vng status 255 and no output, while the same kernel booted fine before and after."""
    failed_boots: list[str] = []
    while True:
        res = _run_once(cfg)
        if res.rc != 125 or res.boot_s is not None or res.timed_out or len(failed_boots) >= BOOT_RETRIES:
            res.messages[:0] = failed_boots
            return res
        failed_boots.append(
            f"boot {len(failed_boots) + 1} ended before CMD started after {res.wall_s:.1f} s "
            f"({'; '.join(res.messages)}); booting again"
        )
        print(f"[vm] {failed_boots[-1]}", file=sys.stderr, flush=True)


def _run_once(cfg: RunConfig) -> RunResult:
    """One boot of the topology (see :func:`run`)."""
    if not cfg.cmd:
        raise HarnessError("no command given: python -m vm run -- CMD...")
    if cfg.topology not in ("netns", "two-guests"):
        raise HarnessError(f"unknown topology {cfg.topology!r} (netns or two-guests)")
    runs = os.path.join(cache_dir(), "runs")
    os.makedirs(runs, exist_ok=True)
    results = tempfile.mkdtemp(prefix="run-", dir=runs)
    roles = ["a"] if cfg.topology == "netns" else ["a", "b"]
    for role in roles:
        os.makedirs(os.path.join(results, role))
    port = _free_port() if cfg.topology == "two-guests" else None
    messages: list[str] = []

    t0 = time.monotonic()
    guests: dict[str, _Guest] = {}
    boot_s: float | None = None
    timed_out = False
    started_file = os.path.join(results, "a", "started")
    try:
        for role in roles:
            prefix = f"[{role.upper()}] " if len(roles) > 1 else ""
            guests[role] = _Guest(role, guest_command(cfg, role, results, port), prefix, vng_env(cfg))
            if role == "a" and port is not None and not _wait_listening(port, guests["a"], 120.0):
                raise HarnessError(f"guest A's QEMU never listened on 127.0.0.1:{port}")
        a = guests["a"]
        deadline = t0 + cfg.timeout
        while a.proc.poll() is None:
            if boot_s is None and os.path.exists(started_file):
                boot_s = time.monotonic() - t0
            if time.monotonic() > deadline:
                timed_out = True
                messages.append(f"timeout: the run exceeded {cfg.timeout:.0f} s; guests killed")
                break
            time.sleep(0.1)
        if "b" in guests:
            try:
                guests["b"].proc.wait(PEER_GRACE_S if not timed_out else 0.1)
            except subprocess.TimeoutExpired:
                messages.append("peer guest B did not power off; killed")
    finally:
        for g in guests.values():
            g.kill()
            g.finish()
    wall = time.monotonic() - t0

    if boot_s is None and os.path.exists(started_file):
        boot_s = wall  # CMD started and finished between two polls
    guest_up: float | None = None
    try:
        with open(started_file) as fh:
            started = json.load(fh)
        guest_up = float(started["uptime"])
        failed = [m for m, ok in started.get("modules", {}).items() if not ok]
        if failed:
            messages.append(f"modules that failed to load in the guest: {', '.join(failed)}")
    except (OSError, ValueError, KeyError):
        pass
    rc = _read_rc(os.path.join(results, "a", "rc"))
    if timed_out:
        rc = 124
    elif rc is None:
        vng_rc = guests["a"].proc.returncode if "a" in guests else None
        messages.append(f"guest A reported no exit status (boot failure or panic?); vng exited {vng_rc}")
        tail = console_tail(os.path.join(results, "a", CONSOLE_LOG))
        if tail:
            messages.append(
                f"guest A's kernel console, last {len(tail)} lines ({CONSOLE_LOG} in the results has all):\n"
                + "\n".join("    " + line for line in tail)
            )
        else:
            messages.append("guest A's kernel console printed nothing (no oops, panic or OOM kill)")
        rc = 125
    if cfg.junit:
        src = os.path.join(results, "a", "junit.xml")
        if os.path.exists(src):
            os.makedirs(os.path.dirname(os.path.abspath(cfg.junit)), exist_ok=True)
            shutil.copyfile(src, cfg.junit)
        else:
            messages.append(f"no JUnit XML produced (expected {src}); --junit {cfg.junit} not written")
    if cfg.copy_out:
        shutil.copytree(os.path.join(results, "a"), cfg.copy_out, dirs_exist_ok=True)
    if "b" in guests:
        rc_b = _read_rc(os.path.join(results, "b", "rc"))
        messages.append(f"peer agent (guest B) exit status: {rc_b}")
    if not cfg.keep_results:
        shutil.rmtree(results, ignore_errors=True)
    return RunResult(rc, boot_s, guest_up, wall, results, timed_out, messages)
