"""Which kernel the suite runs on, and which of its known RDS/TCP races a scenario may meet.

The conformance suite runs on every kernel of the matrix (Debian's 6.1, 6.12, 7.3). Some kernels have RDS/TCP
bugs that make an outcome depend on timing (docs in ``../shared/reference/kernels.md``; fixed in mainline
7.0 by the "RDS-TCP bug fix collection": accept no longer discards messages, the path index is encoded in
the TCP source port, shutdown no longer drops acked messages). A scenario that meets such a race on a kernel
that has it must not flip between runs: it records the kernel's behaviour with a fixed outcome (xfail with
a fixed reason; what arrived is printed to the test's log) and is strict on kernels that carry the fixes.
"""

from __future__ import annotations

import platform
import re

__all__ = ["KernelRace", "RDS_TCP_FIX_SERIES", "has_race", "kernel_line"]

#: the first mainline release with the 2025-26 RDS/TCP fix series
RDS_TCP_FIX_SERIES = (7, 0)


def kernel_line(release: str | None = None) -> tuple[int, int] | None:
    """(major, minor) of ``release`` (default: the running kernel), None if it does not parse."""
    m = re.match(r"^(\d+)\.(\d+)", release if release is not None else platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else None


class KernelRace:
    """A known timing-dependent RDS/TCP defect of kernels before ``fixed_in``."""

    def __init__(self, name: str, reason: str, fixed_in: tuple[int, int] = RDS_TCP_FIX_SERIES) -> None:
        self.name = name
        self.reason = reason
        self.fixed_in = fixed_in

    def present(self, release: str | None = None) -> bool:
        line = kernel_line(release)
        return line is not None and line < self.fixed_in


def has_race(race: KernelRace, release: str | None = None) -> bool:
    return race.present(release)
