"""Whether this node has RDMA devices, without touching verbs: the names under ``/sys/class/infiniband``."""

from __future__ import annotations

import os

__all__ = ["SYSFS_RDMA", "rdma_devices"]

SYSFS_RDMA = "/sys/class/infiniband"


def rdma_devices(root: str = SYSFS_RDMA) -> list[str]:
    """The RDMA devices sysfs lists (rxe, mlx5_0, ...), sorted; empty when there are none (or no sysfs)."""
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []
