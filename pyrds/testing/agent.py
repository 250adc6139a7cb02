"""A socket agent: a child process (usually inside another network namespace) that owns RDS sockets for a
test.

Why: a process can only create sockets in its own network namespace (AF_RDS and the userspace stack's abstract
unix socket are both per netns), so each node of a two-node scenario runs one agent and the test drives it.

Protocol (parent <-> agent over the agent's stdin/stdout pipes): frames of a 4-byte big-endian length followed
by a pickled tuple. Request ``(op, *args)``; reply ``("ok", value)``, ``("oserror", errno, text)`` or
``("error", exc_type_name, text)``. Ops:

- ``socket(backend) -> handle``; ``call(handle, method, args) -> value`` (any RDSSocketBase method);
  ``poll(handle, events, timeout_ms) -> revents``; ``close_all()``;
- ``job(func, handles, kwargs) -> job id``: runs ``"module:function"(sockets, **kwargs)`` in a thread (bulk
  workloads that must not pay one RPC per message); ``wait(job id, timeout) -> result`` (re-raises its error);
- ``write_file(path, text)`` / ``read_file(path)``: sysctls as seen from the agent's namespace;
- ``mem_alloc(size) -> (handle, address)``, ``mem_read(handle, offset, length) -> bytes``,
  ``mem_write(handle, offset, data)``, ``mem_free(handle)``: page-aligned anonymous memory in the agent, for
  RDMA (the addresses in RDMA cmsgs name memory of the process that owns the socket): at most
  :data:`MEM_MAX` bytes a buffer and :data:`MEM_TOTAL` in all, every access inside its buffer (ValueError
  otherwise, TypeError for a wrong type, KeyError for an unknown handle); ``close_all`` frees them after
  closing the sockets;
- ``exit``.

The agent is trusted test code (pickle over a private pipe); it is not a network service.
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

_HDR = struct.Struct(">I")
#: the largest agent buffer (an RDMA region is at most 1 MiB + a page) and all of an agent's buffers together
MEM_MAX = 4 << 20
MEM_TOTAL = 32 << 20


def _write_frame(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HDR.pack(len(data)) + data)
    stream.flush()


def _read_frame(stream: BinaryIO) -> Any:
    hdr = stream.read(_HDR.size)
    if len(hdr) < _HDR.size:
        raise EOFError("agent pipe closed")
    (n,) = _HDR.unpack(hdr)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("agent pipe closed mid-frame")
    return pickle.loads(data)


def start_userspace_stack(timeout: float = 120.0) -> None:
    """Make sure this namespace's userspace stack service runs (the client's own autostart waits 10 s, which a
    cold start under QEMU TCG can exceed); retries socket creation, each retry re-spawning the service."""
    import time

    import pyrds

    deadline = time.monotonic() + timeout
    while True:
        try:
            pyrds.socket("userspace").close()
            return
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _resolve(func: str) -> Callable[..., Any]:
    module, _, name = func.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


class _Job:
    def __init__(self, fn: Callable[..., Any], socks: list[Any], kwargs: dict[str, Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, socks, kwargs), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[..., Any], socks: list[Any], kwargs: dict[str, Any]) -> None:
        try:
            self.result = fn(socks, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - shipped back to the parent
            self.error = exc


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if type(value) is not int:
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is not in [{low}, {high}]")
    return value


class _Buffer:
    """An anonymous mapping and the ctypes view that gives its address (released by :meth:`release`)."""

    def __init__(self, size: int) -> None:
        import ctypes
        import mmap

        self.size = size
        self.map: Any = mmap.mmap(-1, size)
        self.view: Any = (ctypes.c_char * size).from_buffer(self.map)
        self.addr: int = ctypes.addressof(self.view)

    def span(self, offset: Any, length: Any) -> tuple[int, int]:
        offset = _check_int("offset", offset, 0, self.size)
        length = _check_int("length", length, 0, self.size - offset)
        return offset, offset + length

    def release(self) -> None:
        self.view = None  # the export must go before the mapping can close
        self.map.close()


class _AgentServer:
    def __init__(self) -> None:
        self.socks: dict[int, Any] = {}
        self.jobs: dict[int, _Job] = {}
        self.buffers: dict[int, _Buffer] = {}
        self.next_id = 1

    def op_socket(self, backend: str) -> int:
        import pyrds

        if backend == "userspace" and not self.socks:
            start_userspace_stack()
        sock = pyrds.socket(backend)  # type: ignore[arg-type]
        hid = self.next_id
        self.next_id += 1
        self.socks[hid] = sock
        return hid

    def op_call(self, hid: int, method: str, args: Sequence[Any]) -> Any:
        result = getattr(self.socks[hid], method)(*args)
        if method == "close":
            self.socks.pop(hid, None)
        return result

    def op_poll(self, hid: int, events: int, timeout_ms: int) -> int:
        p = select.poll()
        p.register(self.socks[hid].fileno(), events)
        res = p.poll(timeout_ms)
        return res[0][1] if res else 0

    def op_close_all(self) -> None:
        for sock in self.socks.values():
            try:
                sock.close()
            except OSError:
                pass
        self.socks.clear()
        for buf in self.buffers.values():
            buf.release()
        self.buffers.clear()

    def op_job(self, func: str, handles: Sequence[int], kwargs: dict[str, Any]) -> int:
        jid = self.next_id
        self.next_id += 1
        self.jobs[jid] = _Job(_resolve(func), [self.socks[h] for h in handles], kwargs)
        return jid

    def op_wait(self, jid: int, timeout: float | None) -> Any:
        job = self.jobs[jid]
        job.thread.join(timeout)
        if job.thread.is_alive():
            raise TimeoutError(f"job {jid} still running after {timeout}s")
        del self.jobs[jid]
        if job.error is not None:
            raise job.error
        return job.result

    def op_write_file(self, path: str, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)

    def op_read_file(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def op_getpid(self) -> int:
        return os.getpid()

    def op_mem_alloc(self, size: Any) -> tuple[int, int]:
        size = _check_int("size", size, 1, MEM_MAX)
        held = sum(b.size for b in self.buffers.values())
        if held + size > MEM_TOTAL:
            raise ValueError(f"{size} more bytes would exceed the agent's {MEM_TOTAL} ({held} held)")
        buf = _Buffer(size)
        bid = self.next_id
        self.next_id += 1
        self.buffers[bid] = buf
        return bid, buf.addr

    def op_mem_read(self, bid: int, offset: Any, length: Any) -> bytes:
        buf = self.buffers[bid]
        start, end = buf.span(offset, length)
        return bytes(buf.map[start:end])

    def op_mem_write(self, bid: int, offset: Any, data: Any) -> None:
        buf = self.buffers[bid]
        if type(data) is not bytes:
            raise TypeError(f"data must be bytes, not {type(data).__name__}")
        start, end = buf.span(offset, len(data))
        buf.map[start:end] = data

    def op_mem_free(self, bid: int) -> None:
        self.buffers.pop(bid).release()


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    server = _AgentServer()
    while True:
        try:
            req = _read_frame(stdin)
        except EOFError:
            break
        op, args = req[0], req[1:]
        if op == "exit":
            server.op_close_all()
            _write_frame(stdout, ("ok", None))
            break
        try:
            value = getattr(server, f"op_{op}")(*args)
            reply: tuple[Any, ...] = ("ok", value)
        except OSError as exc:
            if exc.errno is None:  # e.g. socket.timeout/TimeoutError("timed out"): keep the type
                reply = ("error", type(exc).__name__, str(exc))
            else:
                reply = ("oserror", exc.errno, exc.strerror or str(exc))
        except BaseException as exc:  # noqa: BLE001
            reply = ("error", type(exc).__name__, str(exc))
        try:
            _write_frame(stdout, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            _write_frame(stdout, ("error", "PicklingError", f"{op}: unpicklable reply: {exc}"))


_EXC: dict[str, type[Exception]] = {
    "TypeError": TypeError,
    "ValueError": ValueError,
    "OverflowError": OverflowError,
    "TimeoutError": TimeoutError,
    "KeyError": KeyError,
}


class AgentError(RuntimeError):
    """An agent-side exception that is not an OSError or a standard argument error."""


class Agent:
    """Parent-side handle of one agent process."""

    def __init__(self, netns: str | None = None, env: dict[str, str] | None = None, name: str = "") -> None:
        self.name = name
        full_env = dict(os.environ)
        full_env.update(env or {})
        # the agent must import this checkout of pyrds whatever the current directory in the netns is
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, full_env.get("PYTHONPATH", "")) if p)
        argv = [sys.executable, "-m", "pyrds.testing.agent"]
        pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "env": full_env}
        if netns is None:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **pipes)
        else:  # spawned from a thread that setns-ed into ``netns`` (pyrds.netns; no pyroute2 import)
            from pyrds.netns import popen_in_netns

            self.proc = popen_in_netns(netns, argv, **pipes)
        self._lock = threading.Lock()
        self.broken: str | None = None  # why the request/reply stream can no longer be trusted
        self.pid: int = self.request("getpid")

    def request(self, op: str, *args: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.broken:
            raise AgentError(f"[agent {self.name}] unusable: {self.broken}")
        with self._lock:
            try:
                _write_frame(self.proc.stdin, (op, *args))  # type: ignore[arg-type]
                reply = _read_frame(self.proc.stdout)  # type: ignore[arg-type]
            except BaseException as exc:
                # Interrupted between request and reply (a test timeout's signal, EOF, ...): the reply may
                # still come and would be read as the answer to the next request. Never reuse this agent.
                self.broken = f"{op} interrupted by {type(exc).__name__}: {exc}"
                self.proc.kill()
                raise
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "oserror":
            raise OSError(reply[1], reply[2])
        exc_type = _EXC.get(reply[1], AgentError)
        raise exc_type(f"[agent {self.name}] {reply[2]}" if exc_type is AgentError else reply[2])

    def socket(self, backend: str) -> RemoteSocket:
        return RemoteSocket(self, self.request("socket", backend), backend)

    def job(self, func: str, socks: Sequence[RemoteSocket], **kwargs: Any) -> int:
        jid: int = self.request("job", func, [s.handle for s in socks], kwargs)
        return jid

    def wait(self, jid: int, timeout: float | None = None) -> Any:
        return self.request("wait", jid, timeout)

    def mem_alloc(self, size: int) -> AgentBuffer:
        """``size`` bytes of page-aligned memory in the agent (zeroed), e.g. for an RDMA region."""
        bid, addr = self.request("mem_alloc", size)
        return AgentBuffer(self, bid, addr, size)

    def close(self) -> None:
        if self.proc.poll() is None and not self.broken:
            try:
                self.request("exit")
            except (EOFError, OSError, BrokenPipeError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class AgentBuffer:
    """Memory in an agent (:meth:`Agent.mem_alloc`): ``addr`` is its address in the agent's process, the one
    to put in the cmsgs of that agent's sockets."""

    def __init__(self, agent: Agent, handle: int, addr: int, size: int) -> None:
        self.agent = agent
        self.handle = handle
        self.addr = addr
        self.size = size

    def __repr__(self) -> str:
        return f"<AgentBuffer {self.agent.name} {self.size} bytes at {self.addr:#x}>"

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        n = self.size - offset if length is None else length
        data: bytes = self.agent.request("mem_read", self.handle, offset, n)
        return data

    def write(self, offset: int, data: bytes) -> None:
        self.agent.request("mem_write", self.handle, offset, bytes(data))

    def free(self) -> None:
        self.agent.request("mem_free", self.handle)


class RemoteSocket:
    """An RDS socket living in an agent; the methods mirror :class:`pyrds.api.RDSSocketBase`."""

    def __init__(self, agent: Agent, handle: int, backend: str) -> None:
        self.agent = agent
        self.handle = handle
        self.backend = backend

    def _call(self, method: str, *args: Any) -> Any:
        return self.agent.request("call", self.handle, method, args)

    def bind(self, address: Any) -> None:
        self._call("bind", address)

    def connect(self, address: Any) -> None:
        self._call("connect", address)

    def getsockname(self) -> Any:
        return self._call("getsockname")

    def getpeername(self) -> Any:
        return self._call("getpeername")

    def send(self, data: bytes, flags: int = 0) -> int:
        n: int = self._call("send", bytes(data), flags)
        return n

    def sendto(self, data: bytes, *args: Any) -> int:
        n: int = self._call("sendto", bytes(data), *args)
        return n

    def sendmsg(
        self, buffers: Sequence[bytes], ancdata: Sequence[Any] = (), flags: int = 0, address: Any = None
    ) -> int:
        n: int = self._call("sendmsg", [bytes(b) for b in buffers], list(ancdata), flags, address)
        return n

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data: bytes = self._call("recv", bufsize, flags)
        return data

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, Any]:
        res: tuple[bytes, Any] = self._call("recvfrom", bufsize, flags)
        return res

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[bytes, Any, int, Any]:
        res: tuple[bytes, Any, int, Any] = self._call("recvmsg", bufsize, ancbufsize, flags)
        return res

    def setsockopt(self, level: int, optname: int, value: int | bytes) -> None:
        self._call("setsockopt", level, optname, value)

    def getsockopt(self, level: int, optname: int, buflen: int = 0) -> int | bytes:
        res: int | bytes = self._call("getsockopt", level, optname, buflen)
        return res

    def get_info(self, info_type: int) -> list[Any]:
        return list(self._call("get_info", info_type))

    def settimeout(self, timeout: float | None) -> None:
        self._call("settimeout", timeout)

    def setblocking(self, flag: bool) -> None:
        self._call("setblocking", flag)

    def poll(self, events: int, timeout_ms: int = 0) -> int:
        rev: int = self.agent.request("poll", self.handle, events, timeout_ms)
        return rev

    def close(self) -> None:
        self._call("close")


def main() -> None:
    # keep the pipe protocol clean: anything printed by imported code goes to stderr
    stdin = sys.stdin.buffer
    stdout = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(stdin, stdout)


if __name__ == "__main__":
    main()
