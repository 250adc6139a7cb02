"""Stack-wide control of this namespace's userspace stack (public): sysctl-like settings, forced reconnects
and the stack's counters. The functions live in :mod:`pyrds.userspace.client.control`."""

from __future__ import annotations

from pyrds.userspace.client.control import force_reconnect, stack_counters, sysctl_get, sysctl_set

__all__ = ["force_reconnect", "stack_counters", "sysctl_get", "sysctl_set"]
