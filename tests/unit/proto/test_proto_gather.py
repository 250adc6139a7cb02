"""The gathered write: ``PathEngine.buffers_to_send`` hands out large payloads as their own buffers, and the
TCP path keeps the unsent rest of a buffer TCP took in part (``_sent``). Same bytes, same accounting, as the
joined ``bytes_to_send``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrds.userspace.proto import MessageReceived, PathEngine
from pyrds.userspace.proto.path import OWN_BUFFER
from pyrds.userspace.transports.tcp.path import _sent


def _engine() -> PathEngine:
    e = PathEngine("10.0.0.1", "10.0.0.2", 0)
    e.connection_made(1000.0)
    return e


@settings(deadline=None, max_examples=60)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 100, OWN_BUFFER - 1, OWN_BUFFER, 70000]), min_size=1, max_size=12),
    max_bytes=st.sampled_from([None, 1, 5000, 256 * 1024]),
    max_buffers=st.integers(min_value=3, max_value=8),
)
def test_buffers_are_the_joined_bytes(sizes: list[int], max_bytes: int | None, max_buffers: int) -> None:
    joined, gathered = _engine(), _engine()
    seqs = []
    for i, n in enumerate(sizes):
        payload = bytes([i % 251]) * n
        joined.queue(4000, 5000, payload)
        seqs.append(gathered.queue(4000, 5000, payload))
    stream = b""
    while True:
        parts = gathered.buffers_to_send(max_bytes, max_buffers)
        if not parts:
            break
        assert len(parts) <= max_buffers
        # a large payload is the queued object itself, not a copy
        assert all(type(p) is bytes for p in parts)
        stream += b"".join(parts)
        assert gathered.tx_bytes == len(stream)
    assert stream == joined.bytes_to_send()
    # every message was written whole and is acked by its own end offset
    acked = gathered.acked_through(len(stream))
    assert [r.seq for r in acked] == seqs
    receiver = PathEngine("10.0.0.2", "10.0.0.1", 0)
    receiver.connection_made(1000.0)
    got = [e.payload for e in receiver.feed(stream, 1000.1) if isinstance(e, MessageReceived)]
    assert [len(p) for p in got] == sizes


def test_large_payload_not_copied() -> None:
    e = _engine()
    e.bytes_to_send()  # the congestion map path 0 sends first
    payload = bytes(70000)
    e.queue(4000, 5000, payload)
    parts = e.buffers_to_send()
    assert len(parts) == 2 and parts[1] is payload and len(parts[0]) == 48


def test_sent_keeps_the_unsent_rest() -> None:
    out: list[bytes | memoryview] = [b"abc", b"defgh", b"ij"]
    _sent(out, 0)
    assert [bytes(p) for p in out] == [b"abc", b"defgh", b"ij"]
    _sent(out, 4)  # all of the first, one byte of the second
    assert [bytes(p) for p in out] == [b"efgh", b"ij"]
    _sent(out, 4)
    assert [bytes(p) for p in out] == [b"ij"]
    _sent(out, 2)
    assert out == []
