"""The stack's cap on empty messages in flight (docs/userspace.md, "Bounded resources"), without a service.

The kernel's send buffer rule (``rds_send_queue_rm``: queue while ``rs_snd_bytes < rds_sk_sndbuf(rs)``)
never stops empty messages: they add no bytes. The stack holds at most ``rds_sndbuf`` of them in flight per
socket; beyond that an empty send gets what a full send buffer gives (EAGAIN, POLLOUT off) until some leave
the socket (acked, cancelled, closed). Non-empty sends keep the kernel's byte rule, also while the socket
holds empty messages."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterator

import pytest

from pyrds.constants import SOL_RDS, SockOpt, Transport
from pyrds.userspace.stack.core import Stack
from pyrds.userspace.stack.errors import StackError
from pyrds.userspace.stack.sockopts import setsockopt
from pyrds.userspace.stack.sockstate import SockState
from pyrds.userspace.transports import loop_transport, tcp_transport
from tests.unit.userspace.fakes import FakeSvc

LO = ipaddress.ip_address("127.0.0.1")
#: a remote address the RDS/TCP transport never gets a connection to (TEST-NET-1, from a loopback source)
NOBODY = ipaddress.ip_address("192.0.2.1")
PORT = 4000


class Poll:
    """A readiness sink that records what the socket's fd would show."""

    def __init__(self) -> None:
        self.readable = False
        self.writable = True
        self.unconfirmed = False

    def set_readable(self, flag: bool) -> None:
        self.readable = flag

    def delivered(self, client_taken: int | None = None) -> None:
        self.unconfirmed = False

    def set_writable(self, flag: bool) -> None:
        self.writable = flag

    def client_drained(self, readable: bool, client_taken: int | None = None) -> None:
        self.readable = readable

    def close(self) -> None:
        pass


@pytest.fixture
def stack() -> Iterator[Stack]:
    stack = Stack()
    stack.attach(loop_transport(stack))
    tcp = tcp_transport(stack, FakeSvc())  # not started: a dial is only recorded, nothing is ever acked
    stack.attach(tcp)
    yield stack
    tcp.close()


def _remote_sender(stack: Stack) -> tuple[SockState, Poll]:
    """A socket with the smallest send buffer whose messages to NOBODY go to the RDS/TCP transport (bound to
    127.0.0.1 it would have the loop transport without SO_RDS_TRANSPORT: rds_conn_create keeps it)."""
    rs = stack.open()
    setsockopt(stack, rs, SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(Transport.TCP).to_bytes(4, "little"))
    setsockopt(stack, rs, socket.SOL_SOCKET, socket.SO_SNDBUF, (1).to_bytes(4, "little"))
    stack.bind(rs, LO, 0, 0)
    poll = Poll()
    rs.readiness = poll
    return rs, poll


def _send_until_refused(stack: Stack, rs: SockState, payload: bytes) -> int:
    """Non-blocking sends of ``payload`` to NOBODY until one is refused (EAGAIN): how many were taken."""
    sent = 0
    with pytest.raises(StackError) as err:
        while True:
            stack.sendmsg(rs, payload, [], 0, (NOBODY, PORT), nonblock=True)
            sent += 1
            assert sent <= 4 * rs.rds_sndbuf, "never refused"
    assert err.value.code == errno.EAGAIN
    return sent


def _cancel(stack: Stack, rs: SockState) -> None:
    sockaddr = socket.AF_INET.to_bytes(2, "little") + PORT.to_bytes(2, "big") + NOBODY.packed + bytes(8)
    setsockopt(stack, rs, SOL_RDS, SockOpt.RDS_CANCEL_SENT_TO, sockaddr)


def test_empty_sends_stop_at_rds_sndbuf_messages_and_cancel_makes_room(stack: Stack) -> None:
    rs, poll = _remote_sender(stack)
    assert rs.rds_sndbuf == 2304  # SOCK_MIN_SNDBUF / 2
    assert _send_until_refused(stack, rs, b"") == rs.rds_sndbuf
    assert len(rs.sent) == rs.rds_sndbuf and rs.snd_bytes == 0
    assert stack.counters["send_queue_msgs_full"] == 1 and stack.counters["send_queue_full"] == 0
    assert not poll.writable  # POLLOUT off, as for a full send buffer
    with pytest.raises(StackError) as err:  # a blocking sender gets the same answer (its client waits)
        stack.sendmsg(rs, b"", [], 0, (NOBODY, PORT), nonblock=False)
    assert err.value.code == errno.EAGAIN
    _cancel(stack, rs)
    assert not rs.sent and rs.snd_empty == 0 and rs.snd_empty_released == rs.rds_sndbuf
    assert poll.writable
    assert _send_until_refused(stack, rs, b"") == rs.rds_sndbuf


def test_an_acked_empty_message_makes_room_for_one(stack: Stack) -> None:
    rs, poll = _remote_sender(stack)
    _send_until_refused(stack, rs, b"")
    stack.acked(next(iter(rs.sent.values())))
    assert poll.writable
    stack.sendmsg(rs, b"", [], 0, (NOBODY, PORT), nonblock=True)
    assert not poll.writable
    with pytest.raises(StackError):
        stack.sendmsg(rs, b"", [], 0, (NOBODY, PORT), nonblock=True)


def test_close_frees_the_empty_messages(stack: Stack) -> None:
    rs, _poll = _remote_sender(stack)
    _send_until_refused(stack, rs, b"")
    stack.close(rs)
    assert not rs.sent and stack.socks == {}
    again, _poll = _remote_sender(stack)
    assert _send_until_refused(stack, again, b"") == again.rds_sndbuf


def test_one_byte_messages_stop_where_the_byte_rule_stops_them(stack: Stack) -> None:
    rs, poll = _remote_sender(stack)
    # rds_send_queue_rm: queued while 0, 1, .., rds_sndbuf - 1 bytes are below rds_sndbuf
    assert _send_until_refused(stack, rs, b"x") == rs.rds_sndbuf
    assert rs.snd_bytes == rs.rds_sndbuf and rs.snd_empty == 0
    assert stack.counters["send_queue_full"] == 1 and stack.counters["send_queue_msgs_full"] == 0
    assert not poll.writable
    with pytest.raises(StackError) as err:  # an empty one too: the byte rule comes first, as in the kernel
        stack.sendmsg(rs, b"", [], 0, (NOBODY, PORT), nonblock=True)
    assert err.value.code == errno.EAGAIN and stack.counters["send_queue_full"] == 2


def test_non_empty_sends_keep_the_byte_rule_while_empty_ones_are_capped(stack: Stack) -> None:
    """The kernel takes these 1-byte sends (its byte count is 0): so does the stack, with the empty messages
    at their cap; only its POLLOUT differs meanwhile (off while the cap holds)."""
    rs, poll = _remote_sender(stack)
    _send_until_refused(stack, rs, b"")
    assert _send_until_refused(stack, rs, b"x") == rs.rds_sndbuf
    assert len(rs.sent) == 2 * rs.rds_sndbuf  # the most a socket holds
    assert not poll.writable


def test_a_local_empty_flood_is_delivered_past_the_cap(stack: Stack) -> None:
    """The loop transport delivers and acks within the send (rds_loop_xmit): nothing stays in flight, so
    the cap never refuses a local sender (the receiver's own cap does, stack/resources.py)."""
    rx, tx = stack.open(), stack.open()
    setsockopt(stack, tx, socket.SOL_SOCKET, socket.SO_SNDBUF, (1).to_bytes(4, "little"))
    stack.bind(rx, LO, PORT, 0)
    stack.bind(tx, LO, 0, 0)
    for _ in range(3 * tx.rds_sndbuf):
        assert stack.sendmsg(tx, b"", [], 0, (LO, PORT), nonblock=True) == 0
    assert not tx.sent and tx.snd_empty == 0
    assert len(rx.recv_queue) == 3 * tx.rds_sndbuf
    assert stack.counters["send_queue_msgs_full"] == 0


def test_a_post_past_the_cap_is_refused(stack: Stack) -> None:
    """Posted sends (service/posting.py) are checked against the grant's buffer: an empty one past the cap
    comes only from a client that broke the rules (it must ask the stack there) and is refused; a non-empty
    one within the byte rule is taken."""
    rs, _poll = _remote_sender(stack)
    rs.grant_dest, rs.grant_sndbuf = (NOBODY, PORT), rs.rds_sndbuf  # what Stack.grant_posts records
    for _ in range(rs.rds_sndbuf):
        stack.sendmsg(rs, b"", [], 0, (NOBODY, PORT), True, posted=True)
    with pytest.raises(StackError) as err:
        stack.sendmsg(rs, b"", [], 0, (NOBODY, PORT), True, posted=True)
    assert err.value.code == errno.EPERM
    assert stack.sendmsg(rs, b"x", [], 0, (NOBODY, PORT), True, posted=True) == 1
