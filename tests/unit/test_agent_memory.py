"""The agent's memory operations (``mem_alloc`` / ``mem_read`` / ``mem_write`` / ``mem_free``): buffers in the
agent process whose addresses RDMA cmsgs of the agent's sockets can name (tests/conformance/test_ib_rdma.py).
Every access is bounded and typed; the address is the agent's own memory, as the userspace stack's service
reaches it (process_vm_readv / process_vm_writev on the agent's pid)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyrds.testing.agent import MEM_MAX, MEM_TOTAL, Agent
from pyrds.userspace.stack.memory import ClientMemory


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    a = Agent(name="mem")
    try:
        yield a
    finally:
        a.close()


def test_alloc_read_write_free(agent: Agent) -> None:
    buf = agent.mem_alloc(10000)
    try:
        assert buf.addr % 4096 == 0
        assert buf.read() == bytes(10000)
        buf.write(4090, b"abcdefghijkl")
        assert buf.read(4088, 16) == b"\0\0abcdefghijkl\0\0"
        assert buf.read(9998) == b"\0\0"
        assert buf.read(10000) == b""
    finally:
        buf.free()
    with pytest.raises(KeyError):
        buf.read(0, 1)


def test_address_is_the_agents_memory(agent: Agent) -> None:
    """What the stack's service does with a client's address: process_vm_readv / writev on its pid."""
    buf = agent.mem_alloc(8192)
    try:
        buf.write(100, b"from the agent")
        mem = ClientMemory(agent.pid)
        assert mem.read(buf.addr + 100, 14) == b"from the agent"
        mem.write(buf.addr + 5000, b"into the agent")
        assert buf.read(5000, 14) == b"into the agent"
    finally:
        buf.free()


@pytest.mark.parametrize(
    ("offset", "length"), [(-1, 1), (0, 4097), (4096, 1), (4097, 0), (10, -1), (0, 1 << 40)]
)
def test_read_outside_the_buffer(agent: Agent, offset: int, length: int) -> None:
    buf = agent.mem_alloc(4096)
    try:
        with pytest.raises(ValueError):
            buf.read(offset, length)
    finally:
        buf.free()


def test_write_outside_the_buffer(agent: Agent) -> None:
    buf = agent.mem_alloc(4096)
    try:
        with pytest.raises(ValueError):
            buf.write(4090, b"1234567")
        with pytest.raises(ValueError):
            buf.write(-1, b"x")
        buf.write(4089, b"1234567")  # exactly to the end
        assert buf.read(4089) == b"1234567"
    finally:
        buf.free()


def test_types_are_checked(agent: Agent) -> None:
    buf = agent.mem_alloc(4096)
    try:
        with pytest.raises(TypeError):
            agent.request("mem_read", buf.handle, 1.0, 1)
        with pytest.raises(TypeError):
            agent.request("mem_read", buf.handle, True, 1)
        with pytest.raises(TypeError):
            agent.request("mem_write", buf.handle, 0, bytearray(b"x"))
        with pytest.raises(TypeError):
            agent.request("mem_alloc", "4096")
    finally:
        buf.free()


def test_sizes_are_bounded(agent: Agent) -> None:
    for size in (0, -1, MEM_MAX + 1):
        with pytest.raises(ValueError):
            agent.mem_alloc(size)
    held = [agent.mem_alloc(MEM_MAX) for _ in range(MEM_TOTAL // MEM_MAX)]
    try:
        with pytest.raises(ValueError, match="exceed"):
            agent.mem_alloc(1)
    finally:
        for buf in held:
            buf.free()
    agent.mem_alloc(1).free()  # freed buffers count no more


def test_close_all_frees_buffers(agent: Agent) -> None:
    buf = agent.mem_alloc(4096)
    agent.request("close_all")
    with pytest.raises(KeyError):
        buf.read(0, 1)
    with pytest.raises(KeyError):
        buf.free()
