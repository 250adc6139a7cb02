"""Shared by the unit and kernel tests of the C data calls (pyrds/kernel/_fastcall.c)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any

import pytest

from pyrds.kernel import socket as ksock


def fastcall_module() -> ModuleType:
    """The C module, or skip with the reason; under CI or PYRDS_REQUIRE_FASTCALL=1 a missing module fails."""
    module = ksock.FASTCALL
    if module is None:
        why = "pyrds.kernel._fastcall is not built (setup.py needs gcc and Python's headers: python3-dev)"
        if os.environ.get("CI") or os.environ.get("PYRDS_REQUIRE_FASTCALL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return module  # type: ignore[no-any-return]


def python_calls_during(fn: Callable[[], Any]) -> list[str]:
    """The Python functions entered while ``fn`` runs, ``fn`` aside (sys.setprofile's 'call' events)."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is not fn.__code__:
            seen.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen
