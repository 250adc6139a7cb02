"""Host tests of the vm harness plumbing (no guest is booted)."""

from __future__ import annotations

import base64
import os
import shlex
from pathlib import Path

import pytest

from vm import guest, runner
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
    assert not any(a.startswith("--qemu-opts") for a in argv)
    inner = _inner(argv)
    assert inner[-1] == "--junitxml=/res/a/junit.xml"
    assert inner[inner.index("--") + 1 :][:3] == ["python3", "-m", "pytest"]


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
    assert any(x.startswith("--qemu-opts=-netdev socket,id=pyrdsnet,listen=127.0.0.1:4444") for x in a)
    assert any(x.startswith("--qemu-opts=-netdev socket,id=pyrdsnet,connect=127.0.0.1:4444") for x in b)
    assert "--wait-peer" in _inner(a) and "--wait-peer" not in _inner(b)
    assert _inner(b)[-1] == "agent" and "10.99.0.2/24" in _inner(b)


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
    with pytest.raises(KernelNotFound, match="does not exist"):
        find_kernel(str(tmp_path / "nope"))


def test_run_rejects_empty_command() -> None:
    with pytest.raises(runner.HarnessError):
        runner.run(runner.RunConfig(kernel=KERNEL, accel="tcg", cmd=[]))


def test_guest_status_file_helpers(tmp_path: Path) -> None:
    guest.write_json(str(tmp_path / "s"), {"a": 1})
    assert (tmp_path / "s").read_text() == '{"a": 1}'
    assert guest.wait_for(str(tmp_path / "s"), 0.1)
    assert not guest.wait_for(str(tmp_path / "nope"), 0.3)
    assert os.path.exists(tmp_path / "s")
