"""A socket agent on another machine: the node of a scenario that must live in a second guest (RDS/IB
kernel->userspace: the kernel's rds_rdma and a userspace listener cannot share one machine's rdma_cm port).

:mod:`pyrds.testing.agent` speaks pickle over a private pipe to a child process; that is fine between a
parent and its own child, not across a network. This agent serves the same operations over one TCP
connection with :mod:`pyrds.testing.wirecodec` (fixed schema, bounded) and trusts nothing it reads:

- it listens on one address and accepts only ``--allow`` (the other guest's address); one client at a time;
- the client's first frame must be ``("hello", token)`` with the token both guests were given in
  ``$PYRDS_PEER_TOKEN`` (compared in constant time); anything else closes the connection;
- a frame is at most :data:`~pyrds.testing.wirecodec.MAX_FRAME` bytes; every operation is checked: the op from
  :data:`OPS`, socket methods from :data:`METHODS`, jobs from :data:`JOBS`, handles that exist, argument
  types (TypeError / ValueError / KeyError replies otherwise); no file access;
- a failed operation is a reply to that request; the connection and the agent stay up.

Client side: :class:`PeerAgent` has the interface of :class:`~pyrds.testing.agent.Agent` that scenarios use
(``socket``, ``job``, ``wait``, ``mem_alloc``, ``request``, ``close``, ``broken``), so a
:class:`~pyrds.testing.agent.RemoteSocket` works on it unchanged.

Run the server in the second guest: ``python -m pyrds.testing.peeragent --token-file FILE`` (listen on
``$PYRDS_LOCAL_ADDR``:18700 for ``$PYRDS_PEER_ADDR``, both set by ``vm``'s two-guests topology; the token is
made fresh and left in FILE, in the results directory both guests share, for the client to read).
"""

from __future__ import annotations

import argparse
import errno
import hmac
import os
import secrets
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyrds.testing import wirecodec
from pyrds.testing.agent import _EXC, AgentBuffer, AgentError, RemoteSocket, _AgentServer

__all__ = ["JOBS", "METHODS", "OPS", "PORT", "PeerAgent", "PeerServer", "TOKEN_ENV", "read_token_file"]

TOKEN_ENV = "PYRDS_PEER_TOKEN"
#: the TCP port the agent listens on by default
PORT = 18700
#: a token shorter than this is refused (it is the only thing between a client and the agent's sockets)
MIN_TOKEN = 16
_HDR = struct.Struct(">I")
#: the operations of :class:`~pyrds.testing.agent._AgentServer` a peer may ask for (no file access)
OPS = frozenset(
    {
        "getpid",
        "socket",
        "call",
        "poll",
        "close_all",
        "job",
        "wait",
        "mem_alloc",
        "mem_read",
        "mem_write",
        "mem_free",
        "exit",
    }
)
#: socket methods :meth:`RemoteSocket` calls
METHODS = frozenset(
    {
        "bind",
        "connect",
        "getsockname",
        "getpeername",
        "send",
        "sendto",
        "sendmsg",
        "recv",
        "recvfrom",
        "recvmsg",
        "setsockopt",
        "getsockopt",
        "get_info",
        "settimeout",
        "setblocking",
        "close",
    }
)
#: the jobs (``module:function``) a peer may start
JOBS = frozenset(
    {
        "pyrds.testing.workloads:exchange",
        "pyrds.testing.workloads:drain",
        "pyrds.testing.workloads:socket_selftest",
        "pyrds.testing.workloads:stress_passive",
        "pyrds.testing.workloads:stress_passive_stop",
        "pyrds.testing.ib:info_table",
    }
)
BACKENDS = frozenset({"kernel", "userspace"})
#: how long a request may wait for its reply (a ``wait`` adds its own timeout)
REPLY_TIMEOUT = 300.0
#: the longest ``wait`` request the server takes, and the slice :meth:`PeerAgent.wait` asks for at a time
WAIT_MAX = 3600
WAIT_SLICE = 600.0


def send_frame(sock: socket.socket, value: Any) -> None:
    data = wirecodec.encode(value)
    sock.sendall(_HDR.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("peer agent connection closed")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> Any:
    (n,) = _HDR.unpack(_recv_exact(sock, _HDR.size))
    if n > wirecodec.MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over {wirecodec.MAX_FRAME}")
    return wirecodec.decode(_recv_exact(sock, n))


def _int(name: str, value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    return value


class PeerServer:
    """The operations of one client connection, checked before they reach the agent's sockets."""

    def __init__(self) -> None:
        self.agent = _AgentServer()

    def handle(self, req: Any) -> tuple[Any, ...]:
        """The reply to one request (never raises for a bad request)."""
        try:
            if not isinstance(req, tuple) or not req or not isinstance(req[0], str):
                raise TypeError("a request is a tuple (op, *args)")
            op, args = req[0], req[1:]
            if op not in OPS:
                raise ValueError(f"unknown op {op!r}")
            return ("ok", getattr(self, f"_op_{op}")(*args))
        except OSError as exc:
            if exc.errno is None:
                return ("error", type(exc).__name__, str(exc))
            return ("oserror", exc.errno, exc.strerror or str(exc))
        except BaseException as exc:  # noqa: BLE001 - every failure is this request's reply
            return ("error", type(exc).__name__, str(exc))

    def _op_getpid(self) -> int:
        return os.getpid()

    def _op_socket(self, backend: Any) -> int:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, not {backend!r}")
        return self.agent.op_socket(backend)

    def _op_call(self, handle: Any, method: Any, args: Any) -> Any:
        if method not in METHODS:
            raise ValueError(f"method {method!r} is not allowed")
        if not isinstance(args, tuple | list):
            raise TypeError("args must be a sequence")
        return self.agent.op_call(_int("handle", handle), method, tuple(args))

    def _op_poll(self, handle: Any, events: Any, timeout_ms: Any) -> int:
        timeout = _int("timeout_ms", timeout_ms)
        if not 0 <= timeout <= 600_000:
            raise ValueError("timeout_ms must be in [0, 600000]")
        return self.agent.op_poll(_int("handle", handle), _int("events", events), timeout)

    def _op_close_all(self) -> None:
        self.agent.op_close_all()

    def _op_job(self, func: Any, handles: Any, kwargs: Any) -> int:
        if func not in JOBS:
            raise ValueError(f"job {func!r} is not allowed")
        if not isinstance(handles, tuple | list) or not isinstance(kwargs, dict):
            raise TypeError("job(func, handles, kwargs)")
        if not all(isinstance(k, str) for k in kwargs):
            raise TypeError("job keyword names must be str")
        return self.agent.op_job(func, [_int("handle", h) for h in handles], kwargs)

    def _op_wait(self, jid: Any, timeout: Any) -> Any:
        if timeout is not None and (not isinstance(timeout, int | float) or not 0 <= timeout <= WAIT_MAX):
            raise ValueError(f"timeout must be None or in [0, {WAIT_MAX}] seconds")
        return self.agent.op_wait(_int("job", jid), timeout)

    def _op_mem_alloc(self, size: Any) -> tuple[int, int]:
        return self.agent.op_mem_alloc(size)

    def _op_mem_read(self, bid: Any, offset: Any, length: Any) -> bytes:
        return self.agent.op_mem_read(_int("buffer", bid), offset, length)

    def _op_mem_write(self, bid: Any, offset: Any, data: Any) -> None:
        self.agent.op_mem_write(_int("buffer", bid), offset, data)

    def _op_mem_free(self, bid: Any) -> None:
        self.agent.op_mem_free(_int("buffer", bid))

    def _op_exit(self) -> None:
        self.agent.op_close_all()


def serve_connection(conn: socket.socket, token: str) -> bool:
    """Serve one authenticated client until it says ``exit`` (True) or goes away (False)."""
    server = PeerServer()
    try:
        conn.settimeout(30.0)
        hello = recv_frame(conn)
        if not (
            isinstance(hello, tuple)
            and len(hello) == 2
            and hello[0] == "hello"
            and isinstance(hello[1], str)
            and hmac.compare_digest(hello[1].encode(), token.encode())
        ):
            return False
        send_frame(conn, ("ok", os.getpid()))
        conn.settimeout(None)
        while True:
            req = recv_frame(conn)
            reply = server.handle(req)
            try:
                send_frame(conn, reply)
            except (TypeError, ValueError) as exc:  # a value the codec cannot carry: this request fails
                send_frame(conn, ("error", "TypeError", f"unencodable reply: {exc}"))
            if reply[0] == "ok" and isinstance(req, tuple) and req[:1] == ("exit",):
                return True
    except (OSError, EOFError, ValueError):
        return False
    finally:
        server.agent.op_close_all()
        conn.close()


def new_token_file(path: str) -> str:
    """A fresh random token, written to ``path`` (created now, mode 0600; FileExistsError if it exists)."""
    token = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_token_file(path: str) -> str:
    """The token :func:`new_token_file` wrote (at most 256 bytes read)."""
    with open(path) as f:
        return f.read(256).strip()


def serve(listen: str, port: int, allow: str, token: str, *, once: bool = False) -> None:
    """Accept clients from ``allow`` only, one at a time; with ``once``, stop after a client said ``exit``."""
    if len(token) < MIN_TOKEN:
        raise ValueError(f"${TOKEN_ENV} must hold at least {MIN_TOKEN} characters")
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    allowed = socket.getaddrinfo(allow, None, family)[0][4][0]
    lsock = socket.socket(family, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((listen, port))
    lsock.listen(1)
    print(f"peer agent: listening on {listen}:{port} for {allowed}", file=sys.stderr, flush=True)
    try:
        while True:
            conn, addr = lsock.accept()
            if addr[0] != allowed:
                conn.close()
                continue
            if serve_connection(conn, token) and once:
                return
    finally:
        lsock.close()


class _Connected:
    """What :class:`~pyrds.testing.ib.IbPair` asks of an agent's process: ``poll()`` is None while up."""

    def __init__(self, agent: PeerAgent) -> None:
        self.agent = agent

    def poll(self) -> int | None:
        return None if self.agent.sock is not None else 0


class PeerAgent:
    """The client of a :func:`serve` on another machine, with the interface of
    :class:`~pyrds.testing.agent.Agent`."""

    def __init__(
        self, host: str, port: int, token: str, name: str = "", connect_timeout: float = 120.0
    ) -> None:
        self.name = name
        self.broken: str | None = None
        self.proc = _Connected(self)
        deadline = time.monotonic() + connect_timeout
        while True:  # the other guest may still be booting
            try:
                sock = socket.create_connection((host, port), timeout=10.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.sock: socket.socket | None = sock
        sock.settimeout(REPLY_TIMEOUT)
        send_frame(sock, ("hello", token))
        reply = recv_frame(sock)
        if not (isinstance(reply, tuple) and reply[:1] == ("ok",)):
            raise AgentError(f"[peer agent {name}] refused the hello")
        self.pid: int = reply[1]

    def request(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        if self.broken or self.sock is None:
            raise AgentError(f"[peer agent {self.name}] unusable: {self.broken or 'closed'}")
        try:
            self.sock.settimeout(REPLY_TIMEOUT if timeout is None else timeout + REPLY_TIMEOUT)
            send_frame(self.sock, (op, *args))
            reply = recv_frame(self.sock)
        except BaseException as exc:
            self.broken = f"{op} interrupted by {type(exc).__name__}: {exc}"
            self.sock.close()
            self.sock = None
            raise
        if not isinstance(reply, tuple) or not reply:
            raise AgentError(f"[peer agent {self.name}] malformed reply")
        if reply[0] == "ok" and len(reply) == 2:
            return reply[1]
        if reply[0] == "oserror" and len(reply) == 3 and isinstance(reply[1], int):
            raise OSError(reply[1], str(reply[2]))
        if reply[0] == "error" and len(reply) == 3:
            exc_type = _EXC.get(str(reply[1]), AgentError)
            text = str(reply[2])
            raise exc_type(f"[peer agent {self.name}] {text}" if exc_type is AgentError else text)
        raise AgentError(f"[peer agent {self.name}] malformed reply")

    def socket(self, backend: str) -> RemoteSocket:
        return RemoteSocket(self, self.request("socket", backend), backend)  # type: ignore[arg-type]

    def job(self, func: str, socks: Sequence[RemoteSocket], **kwargs: Any) -> int:
        jid: int = self.request("job", func, [s.handle for s in socks], kwargs)
        return jid

    def wait(self, jid: int, timeout: float | None = None) -> Any:
        """The job's result, waiting at most ``timeout`` s (None: for ever) in requests of at most
        :data:`WAIT_SLICE` s each (the server refuses a wait over :data:`WAIT_MAX`, and every request's
        reply must come within its wait plus :data:`REPLY_TIMEOUT`); TimeoutError when the job still runs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
            try:
                return self.request("wait", jid, left, timeout=left)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def mem_alloc(self, size: int) -> AgentBuffer:
        bid, addr = self.request("mem_alloc", size)
        return AgentBuffer(self, bid, addr, size)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.sock is None:
            return
        if not self.broken:
            try:
                self.request("exit")
            except (OSError, EOFError, AgentError):
                pass
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pyrds.testing.peeragent", description=(__doc__ or "").split("\n\n")[0]
    )
    env = os.environ
    ap.add_argument(
        "--listen", default=env.get("PYRDS_LOCAL_ADDR"), help="the address to listen on ($PYRDS_LOCAL_ADDR)"
    )
    ap.add_argument("--port", type=int, default=PORT, help=f"default {PORT}")
    ap.add_argument(
        "--allow",
        default=env.get("PYRDS_PEER_ADDR"),
        help="the only client address accepted, the other guest's ($PYRDS_PEER_ADDR)",
    )
    ap.add_argument(
        "--token-file",
        help=f"make a fresh token and write it here (mode 0600, a new file) instead of ${TOKEN_ENV}",
    )
    ap.add_argument("--once", action="store_true", help="exit after a client said exit")
    args = ap.parse_args(argv)
    if not args.listen or not args.allow:
        ap.error("--listen and --allow are needed (or $PYRDS_LOCAL_ADDR and $PYRDS_PEER_ADDR)")
    try:
        token = new_token_file(args.token_file) if args.token_file else env.get(TOKEN_ENV, "")
        serve(args.listen, args.port, args.allow, token, once=args.once)
    except ValueError as exc:
        print(f"peer agent: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"peer agent: {errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
