"""Locate the guest kernel (vmlinuz + modules): an alias of the matrix (6.1, 6.12, 7.3) or an image path."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from vm import catalog

BOOT_GLOB = "/boot/vmlinuz-6.1.0-*-amd64"
#: modules the guest needs for pyrds (checked on the host so a missing package fails before booting)
REQUIRED_MODULES = (
    "net/rds/rds.ko",
    "net/rds/rds_tcp.ko",
    "net/rds/rds_rdma.ko",
    "drivers/infiniband/sw/rxe/rdma_rxe.ko",
)


class KernelNotFound(RuntimeError):
    """No usable guest kernel on this host."""


@dataclass(frozen=True)
class GuestKernel:
    vmlinuz: str
    release: str  # e.g. "6.1.0-56-amd64"

    @property
    def modules_dir(self) -> str:
        return f"/lib/modules/{self.release}"


def _abi(path: str) -> int:
    m = re.search(r"vmlinuz-6\.1\.0-(\d+)-amd64$", path)
    return int(m.group(1)) if m else -1


def find_kernel(explicit: str | None = None) -> GuestKernel:
    """The guest kernel, after checking its modules exist.

    ``explicit``: None or ``"6.1"`` (the newest bookworm kernel under /boot), another alias of
    :data:`vm.catalog.MATRIX` (what ``python -m vm fetch-kernels`` installed), or a vmlinuz path (its release
    is the file name's ``vmlinuz-REL`` suffix, or the name of the directory holding a plain ``vmlinuz``).
    """
    if explicit and explicit != "6.1" and explicit in catalog.ALIASES:
        rec = catalog.recorded(explicit)
        if rec is None or not os.path.isfile(rec.get("vmlinuz", "")):
            raise KernelNotFound(
                f"kernel {explicit} is not installed: python -m vm fetch-kernels {explicit} (.ci/setup)"
            )
        return _checked(GuestKernel(vmlinuz=rec["vmlinuz"], release=rec["release"]))
    if explicit and explicit != "6.1":
        if not os.path.isfile(explicit):
            raise KernelNotFound(
                f"kernel {explicit!r} is neither an image file nor one of {', '.join(catalog.ALIASES)}"
            )
        candidates = [explicit]
    else:
        candidates = sorted(glob.glob(BOOT_GLOB), key=_abi)
        if not candidates:
            raise KernelNotFound(
                f"no bookworm kernel under /boot (looked for {BOOT_GLOB}): apt-get install linux-image-amd64"
            )
    vmlinuz = candidates[-1]
    base = os.path.basename(vmlinuz)
    if base.startswith("vmlinuz-"):
        release = base.removeprefix("vmlinuz-")
    elif base == "vmlinuz":
        release = os.path.basename(os.path.dirname(vmlinuz))
    else:  # a build tree's arch/x86/boot/bzImage: the release its header names
        found = image_release(vmlinuz)
        if found is None:
            raise KernelNotFound(
                f"{vmlinuz}: no kernel release in its name (vmlinuz-REL) nor in an x86 boot header"
            )
        release = found
    return _checked(GuestKernel(vmlinuz=vmlinuz, release=release))


#: x86 boot protocol (Documentation/arch/x86/boot.rst): "HdrS" at 0x202; at 0x20E the offset, less 0x200, of
#: the NUL-terminated version string ("7.3.4+deb13-amd64 (builder) #1 SMP ..."), in the setup code
_HDR_MAGIC_AT = 0x202
_VERSION_PTR_AT = 0x20E
_SETUP_READ = 0x10000  # the string sits in the real-mode setup code: at 17-18 KiB in Debian's three images


def image_release(path: str) -> str | None:
    """The release an x86 kernel image names in its boot header (``uname -r`` of that kernel: what
    ``make modules_install`` named ``/lib/modules/<release>``), or None for any other file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SETUP_READ)
    except OSError:
        return None
    if head[_HDR_MAGIC_AT : _HDR_MAGIC_AT + 4] != b"HdrS" or len(head) < _VERSION_PTR_AT + 2:
        return None
    start = int.from_bytes(head[_VERSION_PTR_AT : _VERSION_PTR_AT + 2], "little") + 0x200
    end = head.find(b"\0", start)
    if not 0x200 < start < end:
        return None
    words = head[start:end].split()
    release = words[0].decode("ascii", "replace") if words else ""
    if not re.fullmatch(r"[A-Za-z0-9_.+~-]{1,64}", release):
        return None
    return release


def _checked(kernel: GuestKernel) -> GuestKernel:
    release = kernel.release
    if not os.access(kernel.vmlinuz, os.R_OK):
        raise KernelNotFound(f"{kernel.vmlinuz} is not readable (run as root or chmod o+r it)")
    for rel in REQUIRED_MODULES:
        path = os.path.join(kernel.modules_dir, "kernel", rel)
        if not any(os.path.exists(path + ext) for ext in ("", ".xz", ".zst", ".gz")):
            raise KernelNotFound(
                f"{path} missing: the modules of {release} are not installed "
                f"(apt-get install linux-image-{release}, or python -m vm fetch-kernels)"
            )
    return kernel
