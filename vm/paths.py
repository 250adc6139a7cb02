"""Host paths used by the harness."""

from __future__ import annotations

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/pyrds`` (default ``~/.cache/pyrds``); the guest sees it read-only through 9p."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pyrds")
