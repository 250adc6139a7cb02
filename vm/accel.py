"""Choose the QEMU accelerator: KVM only when a bounded probe boot proves it works, else TCG.

``PYRDS_VM_ACCEL=kvm|tcg|auto`` (default auto). ``auto`` probes once per (host kernel, QEMU, guest kernel)
and caches the answer in ``~/.cache/pyrds/accel.json``. The probe boots the guest kernel with no root
filesystem under ``-accel kvm -cpu host``; a working KVM reaches "VFS: Unable to mount root" within seconds.
On this project's hosts KVM is PVM and QEMU aborts at once ("failed to set MSR 0x10a"), so auto gives TCG.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Literal

from vm.paths import cache_dir

Accel = Literal["kvm", "tcg"]
PROBE_TIMEOUT_S = 20.0
QEMU = "qemu-system-x86_64"


def _qemu_version() -> str:
    try:
        out = subprocess.run([QEMU, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


def probe_kvm(vmlinuz: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Boot ``vmlinuz`` under KVM for at most ``timeout`` seconds; (works, reason)."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm missing or not accessible"
    argv = [
        QEMU, "-accel", "kvm", "-cpu", "host", "-m", "256", "-nodefaults", "-display", "none",
        "-no-reboot", "-serial", "stdio", "-kernel", vmlinuz,
        "-append", "console=ttyS0 panic=-1 root=/dev/nonexistent",
    ]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        text = out.stdout + out.stderr
    except subprocess.TimeoutExpired:
        return False, f"KVM probe did not reach the root mount within {timeout:.0f} s"
    except OSError as exc:
        return False, f"cannot run {QEMU}: {exc}"
    if "VFS:" in text or "Kernel panic" in text:
        return True, "KVM probe booted to the root mount"
    last = text.strip().splitlines()[-1:] or ["no output"]
    return False, f"KVM probe failed (rc {out.returncode}): {last[0][:200]}"


def resolve_accel(vmlinuz: str, mode: str | None = None, *, verbose: bool = False) -> tuple[Accel, str]:
    """(accelerator, reason) for ``mode`` (default: ``$PYRDS_VM_ACCEL`` or auto)."""
    mode = (mode or os.environ.get("PYRDS_VM_ACCEL") or "auto").lower()
    if mode in ("kvm", "tcg"):
        return mode, f"forced by PYRDS_VM_ACCEL/--accel={mode}"  # type: ignore[return-value]
    if mode != "auto":
        raise ValueError(f"accelerator must be kvm, tcg or auto, not {mode!r}")
    if not os.path.exists("/dev/kvm"):
        return "tcg", "no /dev/kvm"
    key = f"{os.uname().release}|{_qemu_version()}|{vmlinuz}"
    cache = os.path.join(cache_dir(), "accel.json")
    try:
        with open(cache) as fh:
            cached = json.load(fh)
        if cached.get("key") == key and cached.get("accel") in ("kvm", "tcg"):
            return cached["accel"], f"cached probe result ({cache}): {cached.get('reason', '')}"
    except (OSError, ValueError):
        pass
    ok, reason = probe_kvm(vmlinuz)
    accel: Accel = "kvm" if ok else "tcg"
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache, "w") as fh:
            json.dump({"key": key, "accel": accel, "reason": reason}, fh)
    except OSError:
        pass
    return accel, reason
