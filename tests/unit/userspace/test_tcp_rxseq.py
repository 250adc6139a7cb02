"""The file that keeps every RDS/TCP path's ``next_rx_seq`` for the next service after a kill
(``transports/tcp/rxseq.py``): what it keeps, what it refuses, and that a path with it drops the resent
copies of what an earlier service's readers already got, while one without it keeps the ACK-before-push
rule."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import time
from pathlib import Path

import pytest

from pyrds.userspace.proto.events import DuplicateDropped, MessageReceived, PeerGenChanged
from pyrds.userspace.proto.path import PathEngine
from pyrds.userspace.transports.tcp import path as tcp_path
from pyrds.userspace.transports.tcp import rxseq
from pyrds.userspace.transports.tcp.path import TcpPath
from tests.unit.userspace.conftest import tcp_connection
from tests.unit.userspace.test_tcp_path_close import FADDR, LADDR, FakeConn
from tests.unit.userspace.test_tcp_read_ack import Host, _arrive

A = ipaddress.ip_address("10.1.0.1")
B = ipaddress.ip_address("10.1.0.2")
V6 = ipaddress.ip_address("fd00::2")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def _open(d: Path, name: str = "stack") -> rxseq.RxSeqPage:
    page = rxseq.open_page(None, name, str(d))
    assert page is not None
    return page


def test_a_stored_sequence_is_what_the_next_service_resumes_from(state_dir: Path) -> None:
    page = _open(state_dir)
    at = page.slot(A, B, 3)
    assert at is not None and page.resume(at) == 0
    page.store(at, 41)
    other = page.slot(A, B, 4)
    v6 = page.slot(A, V6, 3)
    assert other is not None and v6 is not None and len({at, other, v6}) == 3
    page.store(other, 7)
    page.close(remove=False)  # a kill: the file stays

    again = _open(state_dir)
    assert again.slot(A, B, 3) == at and again.resume(at) == 41
    assert again.resume(again.slot(A, B, 4) or 0) == 7
    assert again.resume(again.slot(B, A, 3) or 0) == 0, "the other direction is another key"
    path = again.path
    assert path is not None
    again.close(remove=True)  # a clean exit removes it
    assert not os.path.exists(path)
    assert _open(state_dir).resume(at) == 0


def test_a_file_of_another_size_or_magic_starts_empty(state_dir: Path) -> None:
    page = _open(state_dir)
    at = page.slot(A, B, 0)
    assert at is not None
    page.store(at, 99)
    path = page.path
    page.close(remove=False)
    assert path is not None
    with open(path, "r+b") as f:
        f.write(b"NOTMAGIC")
    fresh = _open(state_dir)
    assert fresh.resume(at) == 0
    fresh.close(remove=False)
    with open(path, "ab") as f:
        f.write(b"x")
    assert os.path.getsize(path) == rxseq.SIZE + 1
    _open(state_dir).close(remove=False)
    assert os.path.getsize(path) == rxseq.SIZE


def test_every_slot_taken_leaves_a_path_without_one(state_dir: Path) -> None:
    page = _open(state_dir)
    for i in range(rxseq.SLOTS):
        assert page.slot(A, ipaddress.ip_address(f"10.2.{i // 256}.{i % 256}"), 0) is not None
    assert page.slot(A, B, 0) is None
    assert page.slot(A, ipaddress.ip_address("10.2.0.5"), 0) is not None  # a known key keeps its slot


def test_a_second_service_of_the_same_stack_gets_no_page(state_dir: Path) -> None:
    first = _open(state_dir)
    assert rxseq.open_page(None, "stack", str(state_dir)) is None  # flock: the file is the first one's
    assert rxseq.open_page(None, "other", str(state_dir)) is not None
    first.close(remove=True)
    assert rxseq.open_page(None, "stack", str(state_dir)) is not None


def test_a_directory_or_file_others_could_write_is_refused(state_dir: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o700)
    loose.chmod(0o770)
    assert rxseq.open_page(None, "stack", str(loose)) is None
    page = _open(state_dir)
    path = page.path
    page.close(remove=False)
    assert path is not None
    os.chmod(path, 0o640)
    assert rxseq.open_page(None, "stack", str(state_dir)) is None
    os.unlink(path)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    os.symlink(target, path)
    assert rxseq.open_page(None, "stack", str(state_dir)) is None  # O_NOFOLLOW
    assert target.read_bytes() == b""


def test_a_name_that_is_not_plain_is_hashed_into_the_directory(state_dir: Path) -> None:
    name = rxseq.page_path(str(state_dir), "../../etc/x\0y", 5)
    assert os.path.dirname(name) == str(state_dir) and "/" not in os.path.basename(name)
    assert rxseq.page_path("/d", "pyrds-stack-v6", 0x1F) == "/d/pyrds-stack-v6.000000000000001f.rxseq"


def test_a_private_stack_without_a_runtime_directory_has_no_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert rxseq.page_dir(12345) is None


def _path(sock: socket.socket, page: rxseq.RxSeqPage | None) -> tuple[TcpPath, Host]:
    conn = FakeConn()
    conn.rx_page = page  # type: ignore[assignment]
    host = Host(conn.host)
    conn.host = host
    path = TcpPath(conn, 1)  # type: ignore[arg-type]
    path.established(sock)
    return path, host


def test_a_restarted_path_drops_what_the_last_service_delivered_and_takes_the_rest(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_ack_rule(*_a: object, **_k: object) -> object:
        raise AssertionError("a path with a page needs no ACK before a push")

    monkeypatch.setattr(tcp_path, "_acked_read", no_ack_rule)
    sender = PathEngine(FADDR, LADDR, 1)
    sender.connection_made(0.0)
    for p in (b"one", b"two", b"three"):
        sender.queue(4000, 5000, p)
    first_copy = sender.bytes_to_send()
    cut = 2 * 48 + 6  # "one" and "two" reach the old service; "three" dies in its TCP

    page = _open(state_dir)
    with tcp_connection() as (ours, peer):
        path, host = _path(ours, page)
        _arrive(path, peer, first_copy[:cut])
        assert [i.payload for i in host.incs] == [b"one", b"two"]
        assert all(i.pushable for i in host.incs), "stored, so pushable at once"
    page.close(remove=False)  # SIGKILL: nothing else is written

    sender.connection_lost(0.0)  # the survivor resends all three, RETRANSMITTED, old numbers
    sender.connection_made(0.0)
    resent = sender.bytes_to_send()
    page = _open(state_dir)
    with tcp_connection() as (ours, peer):
        path, host = _path(ours, page)
        assert path.engine.next_rx_seq == 3
        _arrive(path, peer, resent)
        assert [i.payload for i in host.incs] == [b"three"], "the resent copies of one and two are old"
        assert path.host.counters["recv_drop_old_seq"] == 2
    page.close(remove=True)


def test_without_a_page_a_path_keeps_the_ack_before_push_rule(
    tcp_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def acked_read(s: socket.socket, data: bytes, advmss: int = 0) -> tuple[bytes, bool]:
        calls.append(len(data))
        return data, False

    monkeypatch.setattr(tcp_path, "_acked_read", acked_read)
    monkeypatch.setattr(tcp_path, "segments_out", lambda s: 7)
    ours, peer = tcp_pair
    path, host = _path(ours, None)
    sender = PathEngine(FADDR, LADDR, 1)
    sender.connection_made(0.0)
    sender.queue(4000, 5000, b"one")
    _arrive(path, peer, sender.bytes_to_send())
    assert calls and [i.pushable for i in host.incs] == [False]


def test_a_locked_file_is_not_taken_over(state_dir: Path) -> None:
    page = _open(state_dir)
    path = page.path
    page.close(remove=False)
    assert path is not None
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert rxseq.open_page(None, "stack", str(state_dir)) is None
    finally:
        os.close(fd)


def test_files_beyond_the_limit_are_pruned_oldest_first_unless_held(state_dir: Path) -> None:
    names = []
    for i in range(6):
        page = rxseq.open_page(None, f"s{i}", str(state_dir))
        assert page is not None and page.path is not None
        os.utime(page.path, (1000 + i, 1000 + i))
        names.append(page.path)
        if i == 0:
            held = page  # the oldest, but a live service holds it
        else:
            page.close(remove=False)
    assert rxseq.prune(str(state_dir), names[5], limit=3) == 3
    assert [os.path.exists(n) for n in names] == [True, False, False, False, True, True]
    held.close(remove=True)


def test_a_closed_page_gives_no_slot_and_ignores_stores(state_dir: Path) -> None:
    """A connection still draining while the stack stops may add a path: no slot (ACK before push), no
    error from the unmapped file."""
    page = _open(state_dir)
    at = page.slot(A, B, 0)
    assert at is not None
    page.close(remove=True)
    assert page.slot(A, B, 1) is None and page.slot(A, B, 0) is None
    page.store(at, 5)
    assert page.resume(at) == 0


def test_a_reserved_send_sequence_is_kept_per_slot_and_a_new_slot_has_none(state_dir: Path) -> None:
    page = _open(state_dir)
    at = page.slot(A, B, 2)
    assert at is not None and page.tx_reserved(at) == 0
    page.reserve_tx(at, 8193)
    page.store(at, 5)
    page.close(remove=False)
    again = _open(state_dir)
    assert again.tx_reserved(at) == 8193 and again.resume(at) == 5, "each in its own place"
    other = again.slot(A, B, 3)
    assert other is not None and again.tx_reserved(other) == 0


def _written(path: TcpPath, peer: socket.socket, payloads: tuple[bytes, ...]) -> bytes:
    for p in payloads:
        path.engine.queue(5000, 4000, p)
    path.flush()
    time.sleep(0.02)
    return peer.recv(1 << 16)


def test_a_restarted_service_numbers_above_what_the_killed_one_wrote_so_its_resends_are_taken(
    state_dir: Path,
) -> None:
    """The survivor took message 3 of the killed service (next_rx_seq 4); the new service's first message is
    cut off with its first connection and resent, RETRANSMITTED: from 1 again it would be dropped as old."""
    survivor = PathEngine(FADDR, LADDR, 1)
    survivor.connection_made(0.0)
    page = _open(state_dir)
    with tcp_connection() as (ours, peer):
        path, _host = _path(ours, page)
        first = survivor.feed(_written(path, peer, (b"a", b"b", b"c")), 0.0)
    seqs = [ev.header.sequence for ev in first if isinstance(ev, MessageReceived)]
    assert seqs == [1, 2, 3] and survivor.next_rx_seq == 4
    at = page.slot(LADDR, FADDR, 1)
    assert at is not None and page.tx_reserved(at) > 3, "reserved before it was written"
    page.close(remove=False)  # SIGKILL

    page = _open(state_dir)
    with tcp_connection() as (ours, peer):
        path, _host = _path(ours, page)
        assert path.engine.next_tx_seq > 3
        path.engine.queue(5000, 4000, b"new")
        path.engine.bytes_to_send()  # written, and cut off with the connection before the survivor read it
        path.engine.connection_lost(0.0)
        path.engine.connection_made(0.0)
        resent = path.engine.bytes_to_send()
    events = survivor.feed(resent, 0.0)
    assert not [ev for ev in events if isinstance(ev, DuplicateDropped)], "the resent copy is not old"
    assert [ev.payload for ev in events if isinstance(ev, MessageReceived)] == [b"new"]
    page.close(remove=True)


def test_a_peer_that_restarted_numbers_ours_from_1_again_and_so_does_the_page(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = _open(state_dir)
    with tcp_connection() as (ours, peer):
        path, _host = _path(ours, page)
        _written(path, peer, (b"a",))
        at = page.slot(LADDR, FADDR, 1)
        assert at is not None and page.tx_reserved(at) > 1
        monkeypatch.setattr(type(path.conn), "peer_restarted", lambda _self, _p: None, raising=False)
        path.engine.reset_sequences()  # what the engine does when the peer's GEN_NUM changes, then:
        path._event(PeerGenChanged(1, 2))
        assert page.tx_reserved(at) == 0 and path.engine.next_tx_seq == 1
        _written(path, peer, (b"b",))
        assert 1 < page.tx_reserved(at), "reserved again before the next write"
    page.close(remove=True)


def test_a_reserved_send_sequence_is_taken_only_by_a_fresh_path_and_only_below_2_62() -> None:
    eng = PathEngine(LADDR, FADDR, 1)
    eng.resume_tx(1 << 62)  # a damaged file: numbering this high could outgrow the header's 64 bits
    assert eng.next_tx_seq == 1
    eng.resume_tx(5000)
    assert eng.next_tx_seq == 5000
    eng.resume_tx(9000)  # only once, before anything was numbered
    assert eng.next_tx_seq == 5000


def test_a_reservation_out_of_bounds_is_replaced_at_the_first_write(state_dir: Path) -> None:
    page = _open(state_dir)
    at = page.slot(LADDR, FADDR, 1)
    assert at is not None
    page.reserve_tx(at, 1 << 63)
    with tcp_connection() as (ours, peer):
        path, _host = _path(ours, page)
        assert path.engine.next_tx_seq == 1
        _written(path, peer, (b"a",))
        assert 1 < page.tx_reserved(at) < 1 << 62
    page.close(remove=True)
