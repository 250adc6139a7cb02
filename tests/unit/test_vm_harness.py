"""Host tests of the vm harness plumbing (no guest is booted)."""

from __future__ import annotations

import base64
import glob
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pyrds.testing.kernelinfo import short_alias
from pyrds.testing.report import MATRIX_KERNELS
from vm import catalog, cli, guest, runner, virtiofs
from vm import kernel as kernel_mod
from vm.kernel import GuestKernel, KernelNotFound, find_kernel

KERNEL = GuestKernel(vmlinuz="/boot/vmlinuz-6.1.0-99-amd64", release="6.1.0-99-amd64")


@pytest.fixture(autouse=True)
def _fake_vng(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vm.runner.shutil.which", lambda name: f"/usr/bin/{name}")


def _inner(argv: list[str]) -> list[str]:
    return shlex.split(argv[argv.index("--exec") + 1])


def test_netns_command_tcg_and_junit() -> None:
    cfg = runner.RunConfig(
        kernel=KERNEL, accel="tcg", cmd=["python3", "-m", "pytest", "-q"], junit="/x/j.xml"
    )
    argv = runner.guest_command(cfg, "a", "/res", None)
    assert argv[:3] == ["/usr/bin/vng", "--run", KERNEL.vmlinuz]
    assert "--disable-kvm" in argv and "--rwdir" in argv
    (opts,) = [a for a in argv if a.startswith("--qemu-opts=")]  # the cached code trees (cached_trees)
    repo = os.path.realpath(runner.REPO_ROOT)
    tag = f"pyrdsro{runner.cached_trees(cfg).index(repo)}"  # pyrdsro0 unless a shorter tree comes first
    assert f"-virtfs local,path={repo},mount_tag={tag}," in opts
    inner = _inner(argv)
    assert f"{tag}={repo}" in inner
    assert inner[-1] == "--junitxml=/res/a/junit.xml"
    assert inner[inner.index("--") + 1 :][:3] == ["python3", "-m", "pytest"]


def test_cached_trees_do_not_follow_the_hash_seed(tmp_path: Path) -> None:
    """Two trees of one path length (a clone at /tmp/t313 and its venv at /tmp/v313) got their mount tags in
    a set's order, which the string hash seed of each process decides: the same run gave other tags."""
    a, b, c = (tmp_path / name for name in ("venv_a", "venv_b", "venv_c"))
    for d in (a, b, c):
        (d / "bin").mkdir(parents=True)
    code = (
        "import json, sys; from vm import runner; from vm.kernel import GuestKernel\n"
        f"sys.prefix, sys.base_prefix = {str(a)!r}, {str(c)!r}\n"
        "k = GuestKernel(vmlinuz='/v', release='r')\n"
        f"cfg = runner.RunConfig(kernel=k, accel='tcg', cmd=['x'], venv_bin={str(b / 'bin')!r})\n"
        "print(json.dumps(runner.cached_trees(cfg)))"
    )
    seen = set()
    for seed in range(8):
        env = {**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(runner.REPO_ROOT)}
        argv = [sys.executable, "-c", code]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        seen.add(out.stdout)
    (only,) = seen
    trees = json.loads(only)
    assert [t for t in trees if t.startswith(str(tmp_path))] == [str(a), str(b), str(c)]


def test_kvm_drops_disable_kvm_and_placeholders() -> None:
    cfg = runner.RunConfig(
        kernel=KERNEL, accel="kvm", cmd=["tool", "--out={junit}", "{results}/x"], junit="/j"
    )
    argv = runner.guest_command(cfg, "a", "/res", None)
    assert "--disable-kvm" not in argv
    assert _inner(argv)[-2:] == ["--out=/res/a/junit.xml", "/res/a/x"]


def test_two_guests_socket_netdev() -> None:
    cfg = runner.RunConfig(
        kernel=KERNEL, accel="tcg", cmd=["true"], topology="two-guests", peer_cmd=["agent"]
    )
    a = runner.guest_command(cfg, "a", "/res", 4444)
    b = runner.guest_command(cfg, "b", "/res", 4444)
    (opts_a,) = [x for x in a if x.startswith("--qemu-opts=")]  # one option: vng takes the last one only
    (opts_b,) = [x for x in b if x.startswith("--qemu-opts=")]
    assert "-netdev socket,id=pyrdsnet,listen=127.0.0.1:4444" in opts_a and "-virtfs " in opts_a
    assert "-netdev socket,id=pyrdsnet,connect=127.0.0.1:4444" in opts_b
    assert "--wait-peer" in _inner(a) and "--wait-peer" not in _inner(b)
    assert _inner(b)[-1] == "agent" and "10.99.0.2/24" in _inner(b)


def test_peer_ib_guest_a_has_no_link_rxe_and_guest_b_is_small() -> None:
    """--peer-ib: guest A keeps its vCPUs and memory and gets no rxe at boot (the IB phase makes one, after
    the main suite); guest B, the peer agent, gets 1 vCPU and 1G."""
    cfg = runner.RunConfig(
        kernel=KERNEL,
        accel="tcg",
        cmd=["true"],
        topology="two-guests",
        peer_cmd=["agent"],
        peer_cpus=1,
        peer_memory="1G",
        link_rxe_a=False,
    )
    a = runner.guest_command(cfg, "a", "/res", 4444)
    b = runner.guest_command(cfg, "b", "/res", 4444)
    assert a[a.index("-p") + 1] == "2" and a[a.index("-m") + 1] == "2G"
    assert b[b.index("-p") + 1] == "1" and b[b.index("-m") + 1] == "1G"
    inner_a, inner_b = _inner(a), _inner(b)
    assert inner_a[inner_a.index("--rxe") + 1] == ""
    assert "--rxe" not in inner_b  # guest B keeps the default rxe0 on the link


def test_cli_peer_ib_implies_two_guests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.accel_mod, "resolve_accel", lambda vmlinuz, want: ("tcg", "test"))
    monkeypatch.setattr(cli.guestpy, "ensure_venv", lambda create: None)
    monkeypatch.setattr(cli.guestpy, "pyverbs_shim", lambda: None)
    monkeypatch.setattr(cli, "resolve_rootfs", lambda want: (None, "test"))
    args = cli._parser().parse_args(["run", "--peer-ib", "--peer-cmd", "python -m vm.ib_peer", "--", "true"])
    cfg = cli._config(args, KERNEL, None)
    assert cfg.topology == "two-guests" and (cfg.cpus, cfg.memory) == (2, "2G")
    assert (cfg.peer_cpus, cfg.peer_memory, cfg.link_rxe_a) == (1, "1G", False)
    assert cfg.peer_cmd == ["python", "-m", "vm.ib_peer"]
    args = cli._parser().parse_args(["run", "--topology", "two-guests", "--", "true"])
    cfg = cli._config(args, KERNEL, None)
    assert (cfg.cpus, cfg.memory, cfg.peer_cpus, cfg.link_rxe_a) == (1, "1G", None, True)


def test_cached_trees(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The repository, the harness's Python prefixes and the guest venv, each once, nested ones and /usr
    left out; none with code_cache=False (no extra 9p device, no mount in the guest)."""
    base, venv = tmp_path / "base", tmp_path / "venv"
    base.mkdir()
    (venv / "bin").mkdir(parents=True)
    (base / "lib" / "python3.11").mkdir(parents=True)
    monkeypatch.setattr(runner.sys, "base_prefix", str(base))
    monkeypatch.setattr(runner.sys, "prefix", os.path.join(runner.REPO_ROOT, ".tox", "x"))
    monkeypatch.setattr(runner.sysconfig, "get_paths", lambda: {"stdlib": str(base / "lib" / "python3.11")})
    cfg = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"], venv_bin=str(venv / "bin"))
    trees = runner.cached_trees(cfg)
    assert sorted(trees) == sorted([os.path.realpath(runner.REPO_ROOT), str(base), str(venv)])
    monkeypatch.setattr(runner.sys, "base_prefix", "/usr")
    assert "/usr" not in runner.cached_trees(cfg)
    # a Python under /usr (Debian's, the conformance env's base): its standard library alone is cached
    debian_stdlib = next((d for d in ("/usr/lib/python3.11", "/usr/lib/python3") if os.path.isdir(d)), None)
    if debian_stdlib:
        monkeypatch.setattr(runner.sysconfig, "get_paths", lambda: {"stdlib": debian_stdlib})
        trees = runner.cached_trees(cfg)
        assert os.path.realpath(debian_stdlib) in trees and not any(t in ("/usr", "/usr/lib") for t in trees)
    cfg.code_cache = False
    assert runner.cached_trees(cfg) == []
    argv = runner.guest_command(cfg, "a", "/res", None)
    assert not any("-virtfs" in a for a in argv) and "--cached-tree" not in _inner(argv)


def _fake_daemon(path: Path, help_text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ncase \"$1\" in --version) echo 1.0;; --help) echo '{help_text}';; esac\n")
    path.chmod(0o755)
    return str(path)


def test_virtiofs_root_when_a_usable_daemon_exists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A usable virtiofsd: vng gets no --force-9p, --disable-microvm (PCI devices), no extra 9p code-cache
    devices, and a PATH whose first directory holds that daemon as ``virtiofsd`` (vng looks on PATH first)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PYRDS_VM_ROOTFS", raising=False)
    daemon = _fake_daemon(tmp_path / "opt" / "virtiofsd", "--shared-dir <DIR>")
    monkeypatch.setattr(virtiofs, "find_virtiofsd", lambda: daemon)
    found, why = runner.resolve_rootfs()
    assert found == daemon and daemon in why
    assert runner.resolve_rootfs("virtiofs")[0] == daemon
    assert runner.resolve_rootfs("9p")[0] is None
    monkeypatch.setenv("PYRDS_VM_ROOTFS", "9p")
    assert runner.resolve_rootfs()[0] is None
    cfg = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"], virtiofsd=found)
    argv = runner.guest_command(cfg, "a", "/res", None)
    assert "--force-9p" not in argv and "--disable-microvm" in argv
    assert runner.cached_trees(cfg) == []
    assert not any("-virtfs" in a for a in argv) and "--cached-tree" not in _inner(argv)
    first = runner.vng_env(cfg)["PATH"].split(os.pathsep)[0]
    assert os.path.realpath(os.path.join(first, "virtiofsd")) == os.path.realpath(daemon)


def test_9p_root_without_a_usable_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    """No usable virtiofsd: today's 9p root with the code cache, and --force-9p so vng does not try QEMU's
    C daemon (3.1 s lost per boot); --rootfs virtiofs is then an error."""
    monkeypatch.delenv("PYRDS_VM_ROOTFS", raising=False)
    monkeypatch.setattr(virtiofs, "find_virtiofsd", lambda: None)
    assert runner.resolve_rootfs()[0] is None
    with pytest.raises(runner.HarnessError, match="fetch-virtiofsd"):
        runner.resolve_rootfs("virtiofs")
    with pytest.raises(runner.HarnessError):
        runner.resolve_rootfs("nfs")
    cfg = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"])
    argv = runner.guest_command(cfg, "a", "/res", None)
    assert "--force-9p" in argv and "--disable-microvm" not in argv
    assert any("-virtfs" in a for a in argv)
    assert runner.vng_env(cfg)["PATH"] == os.environ.get("PATH")


def test_virtiofsd_lookup_skips_qemus_c_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """QEMU 7.2's C virtiofsd answers --version but not vng's options: not usable; the Rust daemon fetched
    into the cache is found after it; nothing usable -> None."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(virtiofs, "_usable_cache", {})
    monkeypatch.setattr(virtiofs.shutil, "which", lambda name: None)
    c_daemon = _fake_daemon(tmp_path / "qemu" / "virtiofsd", "-o source=PATH  --socket-path=PATH")
    monkeypatch.setattr(virtiofs, "SYSTEM_CANDIDATES", (str(tmp_path / "missing"), c_daemon))
    assert not virtiofs.usable(c_daemon)
    assert virtiofs.find_virtiofsd() is None
    rust = _fake_daemon(Path(virtiofs.fetched_wrapper()), "--shared-dir <DIR>  --readonly")
    assert virtiofs.usable(rust)
    assert virtiofs.find_virtiofsd() == rust


def test_exec_survives_base64_roundtrip() -> None:
    cfg = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["python3", "-c", "print('a b'); x = \"$HOME\""])
    inner = _inner(runner.guest_command(cfg, "a", "/res", None))
    assert inner[-1] == "print('a b'); x = \"$HOME\""
    assert base64.b64decode(base64.b64encode(shlex.join(inner).encode())).decode() == shlex.join(inner)


def test_rc_of_signal(tmp_path: Path) -> None:
    (tmp_path / "rc").write_text("-15\n")
    assert runner._read_rc(str(tmp_path / "rc")) == 143
    assert runner._read_rc(str(tmp_path / "missing")) is None


def test_find_kernel_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vm.kernel.BOOT_GLOB", str(tmp_path / "vmlinuz-6.1.0-*-amd64"))
    with pytest.raises(KernelNotFound, match="apt-get install linux-image-amd64"):
        find_kernel()
    with pytest.raises(KernelNotFound, match="neither an image file nor one of 6.1, 6.12, 7.3"):
        find_kernel(str(tmp_path / "nope"))


def test_kernel_alias_needs_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(KernelNotFound, match="python -m vm fetch-kernels 7.3"):
        find_kernel("7.3")


def test_kernel_alias_resolves_recorded_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rel = "7.3.4+deb13-amd64"
    img = tmp_path / "pyrds" / "kernels" / rel / "vmlinuz"
    img.parent.mkdir(parents=True)
    img.write_bytes(b"x")
    (tmp_path / "pyrds" / "kernels" / "7.3.json").write_text(
        json.dumps({"release": rel, "vmlinuz": str(img), "package": "linux-image-" + rel})
    )
    mods = tmp_path / "modules"
    monkeypatch.setattr(
        kernel_mod.GuestKernel, "modules_dir", property(lambda self: str(mods / self.release))
    )
    with pytest.raises(KernelNotFound, match="rds_tcp.ko missing"):
        for rel_path in kernel_mod.REQUIRED_MODULES:
            if "rds_tcp" not in rel_path:
                (mods / rel / "kernel" / rel_path).parent.mkdir(parents=True, exist_ok=True)
                (mods / rel / "kernel" / (rel_path + ".xz")).write_bytes(b"")
        find_kernel("7.3")
    (mods / rel / "kernel" / "net/rds/rds_tcp.ko.xz").write_bytes(b"")
    k = find_kernel("7.3")
    assert (k.release, k.vmlinuz) == (rel, str(img))


def test_catalog_lookups() -> None:
    names = [
        "linux-image-7.3.4+deb13-amd64",
        "linux-image-7.3.10+deb13-amd64",
        "linux-image-7.3.12+deb13-amd64-dbg",
        "linux-image-7.3.11+deb13-rt-amd64",
        "linux-image-7.30.1+deb13-amd64",
    ]
    assert catalog.newest_image(names, "7.3") == "linux-image-7.3.10+deb13-amd64"
    assert catalog.newest_image(names, "6.12") is None
    assert short_alias("6.1.0-56-amd64") == "6.1"
    assert short_alias("6.12.117+deb13-amd64") == "6.12"
    assert short_alias("7.3.4+deb13-amd64") == "7.3"
    src = catalog.sources_list(("trixie", "trixie-security"))
    assert "debian trixie main" in src and "debian-security trixie-security main" in src
    assert catalog.ALIASES == ("6.1", "6.12", "7.3")
    assert catalog.ALIASES == MATRIX_KERNELS  # the report's copy (pyrds must not import vm/)


def test_matrix_checks_every_kernel_before_booting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    booted: list[object] = []
    monkeypatch.setattr(cli, "run", lambda cfg: booted.append(cfg))
    rc = cli.main(["matrix", "--kernels", "7.3", "--out", str(tmp_path / "out"), "--", "true"])
    assert rc == 2 and booted == []


def test_run_rejects_empty_command() -> None:
    with pytest.raises(runner.HarnessError):
        runner.run(runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=[]))


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
    reason="needs root, nft and unshare",
)
def test_pin_netfilter_hooks_holds_every_inet_hook() -> None:
    """In a new network namespace (never the host's own ruleset): the table guest init loads."""
    code = "from vm import guest; import sys; sys.exit(0 if guest.pin_netfilter_hooks() else 1)"
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} && nft list table inet {guest.PIN_TABLE}"
    res = subprocess.run(
        ["unshare", "-n", "sh", "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    for hook in ("prerouting", "input", "forward", "output", "postrouting"):
        assert f"hook {hook} priority filter; policy accept;" in res.stdout, res.stdout


def test_pin_timestamp_key_holds_a_timestamping_socket() -> None:
    s = guest.pin_timestamp_key()
    assert s is not None
    try:
        assert s.getsockopt(socket.SOL_SOCKET, guest.SO_TIMESTAMP) == 1
    finally:
        s.close()


def test_guest_status_file_helpers(tmp_path: Path) -> None:
    guest.write_json(str(tmp_path / "s"), {"a": 1})
    assert (tmp_path / "s").read_text() == '{"a": 1}'
    assert guest.wait_for(str(tmp_path / "s"), 0.1)
    assert not guest.wait_for(str(tmp_path / "nope"), 0.3)
    assert os.path.exists(tmp_path / "s")


def test_a_boot_that_dies_before_cmd_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"])
    dead = runner.RunResult(125, None, None, 10.7, "/r", messages=["vng exited 255"])
    ran = runner.RunResult(0, 21.0, 12.0, 40.0, "/r", messages=[])
    outcomes = [dead, ran]
    monkeypatch.setattr(runner, "_run_once", lambda _cfg: outcomes.pop(0))
    res = runner.run(cfg)
    assert res.rc == 0 and not outcomes
    assert len(res.messages) == 1 and "boot 1 ended before CMD started" in res.messages[0]


def test_a_failure_after_cmd_started_is_never_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"])
    calls = []
    crashed = runner.RunResult(125, 30.0, 20.0, 90.0, "/r", messages=["guest A reported no exit status"])
    monkeypatch.setattr(runner, "_run_once", lambda _cfg: calls.append(1) or crashed)
    assert runner.run(cfg).rc == 125 and len(calls) == 1
    dead = runner.RunResult(125, None, None, 5.0, "/r", messages=["vng exited 255"])
    calls.clear()
    monkeypatch.setattr(runner, "_run_once", lambda _cfg: calls.append(1) or dead)
    res = runner.run(cfg)
    assert res.rc == 125 and len(calls) == 1 + runner.BOOT_RETRIES and len(res.messages) == 3


def test_every_guest_keeps_its_kernel_console() -> None:
    cfg = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"])
    argv = runner.guest_command(cfg, "a", "/res", None)
    (opts,) = [a for a in argv if a.startswith("--qemu-opts=")]
    chardev = "-chardev file,id=pyrdsconsole,path=/res/a/console.log"
    assert f"{chardev} -device virtconsole,chardev=pyrdsconsole" in opts
    appended = [argv[i + 1] for i, a in enumerate(argv) if a == "--append"]
    assert appended == ["console=hvc0", "loglevel=5"]
    # --verbose shows vng's own console instead; no second console then
    loud = runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"], verbose=True)
    verbose = runner.guest_command(loud, "a", "/res", None)
    assert "--append" not in verbose and not any("pyrdsconsole" in a for a in verbose)


def test_console_tail(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    assert runner.console_tail(str(log)) == []
    log.write_bytes(b"".join(b"[ %d.0] line %d\r\n" % (i, i) for i in range(100)) + b"\xff bad byte\r\n\r\n")
    tail = runner.console_tail(str(log), 3)
    assert tail == ["[ 98.0] line 98", "[ 99.0] line 99", "\ufffd bad byte"]


def test_a_guest_without_exit_status_reports_its_console(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A guest that dies mid-run (here: a fake vng that writes a console and exits 255) is reported with the
    console's last lines, so a kernel panic in CI says what it was."""
    fake = tmp_path / "vng"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in --rwdir) next=1;; *) [ -n "$next" ] && res="$a"; next=;; esac; done\n'
        'echo "{\\"uptime\\": 1.0}" > "$res/a/started"\n'
        'printf "[ 5.0] BUG: kernel NULL pointer dereference\\r\\n'
        '[ 5.1] Kernel panic - not syncing: Fatal\\r\\n" > "$res/a/console.log"\n'
        "exit 255\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(runner, "_vng", lambda: str(fake))
    monkeypatch.setattr(runner, "cached_trees", lambda cfg: [])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    res = runner.run(runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=["true"], timeout=30))
    assert res.rc == 125
    text = "\n".join(res.messages)
    assert "no exit status" in text
    assert "Kernel panic - not syncing: Fatal" in text and "NULL pointer dereference" in text


def _death_then(outcomes: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """Run ``vm matrix`` for 6.1 where each boot ends with the next status of ``outcomes`` (125: the guest
    died after CMD started, its console showing a panic)."""
    monkeypatch.setattr(cli, "find_kernel", lambda alias: KERNEL)
    monkeypatch.setattr(cli, "_config", lambda args, kernel, out: out)

    def fake_run(out: str) -> runner.RunResult:
        rc = outcomes.pop(0)
        os.makedirs(out, exist_ok=True)
        if rc == 125:
            console = "[ 9.0] BUG: kernel NULL pointer dereference\n[ 9.1] Kernel panic\n"
            Path(out, "console.log").write_text(console)
            return runner.RunResult(125, 30.0, 20.0, 99.0, "/r", messages=["guest A reported no exit status"])
        Path(out, "results.json").write_text("{}")
        return runner.RunResult(rc, 30.0, 20.0, 400.0, "/r", messages=[])

    monkeypatch.setattr(cli, "run", fake_run)
    return cli.main(["matrix", "--kernels", "6.1", "--out", str(tmp_path / "out"), *args, "--", "true"])


def test_matrix_boots_again_after_a_guest_died_mid_command_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = [125, 0]
    assert _death_then(outcomes, tmp_path, monkeypatch) == 0 and not outcomes
    out = tmp_path / "out" / "6.1"
    assert (out / "results.json").exists()  # the second boot's results
    (death,) = json.loads((out / "guest-deaths.json").read_text())["deaths"]
    assert death["attempt"] == 1 and death["kernel_crash"] is True
    assert death["console_tail"][-1] == "[ 9.1] Kernel panic"
    # the dead boot's whole console is kept beside the next boot's own
    assert "NULL pointer dereference" in (out / "console-attempt1.log").read_text()
    (row,) = json.loads((tmp_path / "out" / "matrix.json").read_text())["kernels"]
    assert row["rc"] == 0 and row["guest_deaths"] == 1


def test_matrix_gives_up_after_its_reboots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = [125, 125, 0]
    assert _death_then(outcomes, tmp_path, monkeypatch) == 125 and outcomes == [0]
    deaths = json.loads((tmp_path / "out" / "6.1" / "guest-deaths.json").read_text())["deaths"]
    assert [d["attempt"] for d in deaths] == [1, 2]
    outcomes = [125, 0]
    assert _death_then(outcomes, tmp_path, monkeypatch, "--reboots", "0") == 125 and outcomes == [0]
    # a failure of CMD itself (it exited 1) is never booted again
    outcomes = [1, 0]
    assert _death_then(outcomes, tmp_path, monkeypatch) == 1 and outcomes == [0]
    assert not (tmp_path / "out" / "6.1" / "guest-deaths.json").exists()


def _bzimage(path: Path, version: bytes, magic: bytes = b"HdrS") -> Path:
    """A file shaped like an x86 kernel image's setup header: the magic and the version string's pointer."""
    head = bytearray(0x4000)
    head[0x202:0x206] = magic
    at = 0x3000
    head[0x20E:0x210] = (at - 0x200).to_bytes(2, "little")
    head[at : at + len(version) + 1] = version + b"\0"
    path.write_bytes(bytes(head))
    return path


def test_a_build_trees_image_is_named_by_the_release_in_its_boot_header(tmp_path: Path) -> None:
    """arch/x86/boot/bzImage has no release in its name: the header's version string gives the one
    ``make modules_install`` used for /lib/modules/<release> (Debian's images carry the same string)."""
    image = _bzimage(tmp_path / "bzImage", b"7.4.0-rc1-dev+ (me@box) #3 SMP PREEMPT_DYNAMIC")
    assert kernel_mod.image_release(str(image)) == "7.4.0-rc1-dev+"
    with pytest.raises(KernelNotFound, match=r"/lib/modules/7\.4\.0-rc1-dev\+/kernel/net/rds/rds\.ko"):
        find_kernel(str(image))
    assert kernel_mod.image_release(str(_bzimage(tmp_path / "x", b"7.4 x", magic=b"ELF\0"))) is None
    assert kernel_mod.image_release(str(_bzimage(tmp_path / "y", b"../../etc #1"))) is None
    assert kernel_mod.image_release(str(tmp_path / "absent")) is None
    (tmp_path / "short").write_bytes(b"\0" * 0x203)
    assert kernel_mod.image_release(str(tmp_path / "short")) is None
    with pytest.raises(KernelNotFound, match="no kernel release"):
        find_kernel(str(tmp_path / "short"))
    for path in glob.glob("/boot/vmlinuz-6.1.0-*-amd64"):  # a real image, where the host has one
        assert kernel_mod.image_release(path) == os.path.basename(path).removeprefix("vmlinuz-")


def test_matrix_kernels_take_labels_and_refuse_two_of_one_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    images = {
        "6.1": GuestKernel("/boot/vmlinuz-6.1.0-57-amd64", "6.1.0-57-amd64"),
        "/b/vmlinuz-7.4.0-rc1": GuestKernel("/b/vmlinuz-7.4.0-rc1", "7.4.0-rc1"),
        "/src/bzImage": GuestKernel("/src/bzImage", "7.3.4-dirty"),
        "7.3": GuestKernel("/c/vmlinuz", "7.3.4+deb13-amd64"),
    }
    monkeypatch.setattr(cli, "find_kernel", lambda name: images[name])
    got = cli.matrix_kernels("6.1, /b/vmlinuz-7.4.0-rc1 ,7.3,patched=/src/bzImage,")
    assert [(a, k.release) for a, k in got] == [
        ("6.1", "6.1.0-57-amd64"),
        ("7.4", "7.4.0-rc1"),
        ("7.3", "7.3.4+deb13-amd64"),
        ("patched", "7.3.4-dirty"),
    ]
    with pytest.raises(ValueError, match="two kernels would be '7.3'"):
        cli.matrix_kernels("7.3,/src/bzImage")  # a patched 7.3 beside Debian's needs a label
    for bad in ("../x=/src/bzImage", "a b=/src/bzImage", "=/src/bzImage", ".=/src/bzImage", " , "):
        with pytest.raises(ValueError):
            cli.matrix_kernels(bad)


def test_matrix_takes_PYRDS_KERNELS_and_records_its_plan_before_booting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report asks for every kernel matrix.json planned: one whose boot never happened still fails it."""
    monkeypatch.setenv(cli.KERNELS_ENV, "6.1,mine=/src/bzImage")
    monkeypatch.setattr(cli, "find_kernel", lambda name: KERNEL)
    monkeypatch.setattr(cli, "_config", lambda args, kernel, out: out)
    out = tmp_path / "out"
    plans: list[object] = []

    def fake_run(res_dir: str) -> runner.RunResult:
        plans.append(json.loads((out / "matrix.json").read_text())["planned"])
        return runner.RunResult(0, 1.0, 1.0, 2.0, res_dir, messages=[])

    monkeypatch.setattr(cli, "run", fake_run)
    assert cli.main(["matrix", "--out", str(out), "--", "true"]) == 0
    assert plans == [["6.1", "mine"], ["6.1", "mine"]]
    doc = json.loads((out / "matrix.json").read_text())
    assert [r["alias"] for r in doc["kernels"]] == ["6.1", "mine"]
    assert [r["results"] for r in doc["kernels"]] == [str(out / "6.1"), str(out / "mine")]
