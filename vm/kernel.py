"""Locate the Debian bookworm kernel (vmlinuz + modules) the guests boot."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

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
    """The newest bookworm 6.1 kernel under /boot (or ``explicit``), after checking its modules exist."""
    if explicit:
        if not os.path.isfile(explicit):
            raise KernelNotFound(f"kernel image {explicit} does not exist")
        candidates = [explicit]
    else:
        candidates = sorted(glob.glob(BOOT_GLOB), key=_abi)
        if not candidates:
            raise KernelNotFound(
                f"no bookworm kernel under /boot (looked for {BOOT_GLOB}): apt-get install linux-image-amd64"
            )
    vmlinuz = candidates[-1]
    if not os.access(vmlinuz, os.R_OK):
        raise KernelNotFound(f"{vmlinuz} is not readable (run as root or chmod o+r it)")
    release = os.path.basename(vmlinuz).removeprefix("vmlinuz-")
    kernel = GuestKernel(vmlinuz=vmlinuz, release=release)
    for rel in REQUIRED_MODULES:
        path = os.path.join(kernel.modules_dir, "kernel", rel)
        if not any(os.path.exists(path + ext) for ext in ("", ".xz", ".zst", ".gz")):
            raise KernelNotFound(
                f"{path} missing: the modules of {release} are not installed "
                f"(apt-get install linux-image-{release})"
            )
    return kernel
