"""The control protocol's version travels in the stack's name: a client of one format must never talk to a
running service of another (the shared stack can run for weeks under systemd while pyrds is upgraded).

A fingerprint of every record layout, tag, bit and page offset of :mod:`pyrds.userspace.rpc` is pinned here
next to the name it belongs to. Changing the wire without bumping ``DEFAULT_STACK_NAME`` fails this test;
bump the name, then record the new pair."""

from __future__ import annotations

import hashlib
import struct

from pyrds.userspace import rpc
from pyrds.userspace.config import DEFAULT_STACK_NAME

#: (stack name, fingerprint) of the current wire format
PINNED = ("pyrds-stack-v8", "2e67f8387d0faea3")


def wire_fingerprint() -> str:
    parts: list[str] = []
    for name in sorted(vars(rpc)):
        if not name.isupper() or name.startswith("_"):
            continue
        value = getattr(rpc, name)
        if isinstance(value, struct.Struct):
            parts.append(f"{name}={value.format}")
        elif type(value) is int:
            parts.append(f"{name}={value}")
    parts += [f"Op.{op.name}={op.value}" for op in rpc.Op]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def test_the_fingerprint_covers_the_records_and_bits() -> None:
    before = wire_fingerprint()
    saved = rpc.SEND_WAITED
    try:
        rpc.SEND_WAITED = 0x04  # type: ignore[misc]
        assert wire_fingerprint() != before
    finally:
        rpc.SEND_WAITED = saved  # type: ignore[misc]
    saved_rep = rpc.SEND_REP
    try:
        rpc.SEND_REP = struct.Struct("<iq")  # type: ignore[misc]
        assert wire_fingerprint() != before
    finally:
        rpc.SEND_REP = saved_rep  # type: ignore[misc]
    assert wire_fingerprint() == before


def test_the_stack_name_changes_with_the_wire() -> None:
    now = (DEFAULT_STACK_NAME, wire_fingerprint())
    assert now == PINNED, (
        f"the control protocol changed (fingerprint {now[1]}): bump DEFAULT_STACK_NAME in "
        "pyrds/userspace/config.py and record the new (name, fingerprint) in PINNED"
    )
